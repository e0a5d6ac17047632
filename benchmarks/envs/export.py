"""Pack the environment modules as `envlib.zip` for agents' workspaces (importable straight from the zip)."""

from __future__ import annotations

import zipfile
from pathlib import Path

ENVLIB_MODULES = ("__init__", "api", "base", "bm25", "household", "react", "searchqa", "shop")
"""Everything here except the evaluator glue (`task.py`, `export.py`), which imports the harness."""


def write_envlib(dest: Path) -> Path:
    """Write `dest` (a .zip) holding package `envlib`; fixed timestamps, so the bytes are reproducible."""
    src = Path(__file__).parent
    tmp = dest.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ENVLIB_MODULES:
            info = zipfile.ZipInfo(f"envlib/{name}.py", date_time=(2026, 1, 1, 0, 0, 0))
            zf.writestr(info, (src / f"{name}.py").read_text())
    tmp.replace(dest)
    return dest
