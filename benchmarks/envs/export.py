"""Pack the environment modules as `envlib.zip` for agents' workspaces (importable straight from the zip)."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

ENVLIB_MODULES = ("__init__", "api", "base", "bm25", "household", "react", "searchqa", "shop")
"""Everything here except the evaluator glue (`task.py`, `export.py`), which imports the harness."""


def envlib_bytes() -> bytes:
    """The zip holding package `envlib`; fixed timestamps, so the bytes are reproducible."""
    src = Path(__file__).parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in ENVLIB_MODULES:
            info = zipfile.ZipInfo(f"envlib/{name}.py", date_time=(2026, 1, 1, 0, 0, 0))
            zf.writestr(info, (src / f"{name}.py").read_text())
    return buffer.getvalue()


def write_envlib(dest: Path) -> Path:
    """Write `dest` (a .zip) holding package `envlib`, unless it already holds these very modules."""
    data = envlib_bytes()
    if dest.exists() and dest.read_bytes() == data:
        return dest
    tmp = dest.with_suffix(f".zip.{os.getpid()}.tmp")  # concurrent writers each replace whole
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest
