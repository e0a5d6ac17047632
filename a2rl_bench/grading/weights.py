"""Safetensors headers read in bounded memory, and a submission's config checked against its weights.

A safetensors header is agent-written JSON of up to `MAX_SAFETENSORS_HEADER` bytes. `json.loads` builds the whole
tree first: 16 MiB of nested brackets is ~420 MB of Python objects per request. So the header is parsed here
by a strict reader of the one shape a header may have (an object of `{"dtype", "shape", "data_offsets"}` objects
and one `__metadata__` object of strings), two levels deep by construction, keeping only running totals
(`TensorStats`): memory is the header's bytes plus a few words per tensor, whatever the content.

`check_config_against_weights` then refuses a config that implies a far larger model than its weights hold
(`hidden_size` 2^20 beside 100k parameters builds a model until the OOM killer comes): the sizes must be
plausible, the layer count must be the layers the weights hold, the embedding must be vocab x hidden, and the
parameter count the config implies must not exceed the weights'. The exact count (a model built on the meta
device) is compared in the evaluation process, before any weight is loaded (`a2rl_bench.inference.config_check`).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass, field
from typing import Any

from a2rl_bench.grading.errors import SubmissionRejected
from a2rl_bench.inference.config_check import ConfigSizeError, estimated_parameters
from a2rl_bench.inference.config_check import config_sizes as _config_sizes

MAX_SAFETENSORS_HEADER = 16 * 1024**2
"""A real header is ~150 bytes per tensor: a few hundred KiB for the largest shards."""
MAX_HEADER_BYTES_TOTAL = 64 * 1024**2
"""All shards' headers together (thousands of shards of 16 MiB headers would each be read in turn)."""
MAX_TENSORS = 200_000
"""Tensors in one checkpoint; a 671B mixture of experts has ~92,000."""
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
"""The safetensors format's dtypes and their width in bits."""
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer|block|decoder_layers)\.(\d{1,9})\.")
EMBEDDING_NAMES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight",
                   "embed_in.weight")  # fmt: skip


@dataclass
class TensorStats:
    """What the grader keeps of a checkpoint's safetensors headers: totals, never the tree."""

    tensors: int = 0
    numel: int = 0
    layers: set[int] = field(default_factory=set)
    """Layer indices named by the tensors (`model.layers.<i>.…`)."""
    embedding: tuple[str, list[int]] | None = None
    """The input embedding's name and shape, where a tensor has a usual embedding name."""

    header_bytes: int = 0

    def add(self, other: TensorStats) -> None:
        self.header_bytes += other.header_bytes
        if self.header_bytes > MAX_HEADER_BYTES_TOTAL:
            raise SubmissionRejected(f"the checkpoint's safetensors headers hold over {MAX_HEADER_BYTES_TOTAL} bytes")
        self.tensors += other.tensors
        self.numel += other.numel
        self.layers |= other.layers
        self.embedding = self.embedding or other.embedding
        if self.tensors > MAX_TENSORS:
            raise SubmissionRejected(f"the checkpoint holds over {MAX_TENSORS} tensors")


class _Malformed(ValueError):
    pass


_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"((?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+)"')
"""A JSON string, possessive (no backtracking whatever the input); its bytes are decoded only where needed."""
_INTS = r"\[[ \t\n\r]*((?:\d{1,19}[ \t\n\r]*,[ \t\n\r]*){%d,%d}\d{1,19})?[ \t\n\r]*\]"
_SHAPE = re.compile(rb"%b" % (_INTS % (0, 63)).encode())
_OFFSETS = re.compile(rb"%b" % (_INTS % (1, 1)).encode())
MAX_NAME_BYTES = 4096


def parse_safetensors_header(raw: bytes, data_size: int, name: str) -> TensorStats:
    """Check a header's bytes against the format (and the file's data size) in one pass; raises
    SubmissionRejected with a one-line reason. Every tensor's byte range must have its dtype's size, and the
    ranges must tile the data exactly (what the safetensors library itself requires before loading)."""
    stats = TensorStats(header_bytes=len(raw))
    spans: list[tuple[int, int]] = []
    try:
        _check_utf8(raw)
        pos = _skip(raw, 0)
        if not raw.startswith(b"{", pos):
            raise SubmissionRejected(f"{name} is corrupted: unreadable safetensors header: not a JSON object")
        pos = _skip(raw, pos + 1)
        if raw.startswith(b"}", pos):
            pos += 1
        else:
            while True:
                key, pos = _string(raw, pos)
                pos = _expect(raw, pos, b":")
                if key == b"__metadata__":
                    pos = _metadata(raw, pos, name)
                else:
                    pos = _tensor(raw, pos, _name(key, name), name, data_size, stats, spans)
                pos = _skip(raw, pos)
                if raw.startswith(b",", pos):
                    pos = _skip(raw, pos + 1)
                    continue
                pos = _expect(raw, pos, b"}")
                break
        if _skip(raw, pos) != len(raw):
            raise _Malformed("text after the header object")
    except (_Malformed, UnicodeDecodeError) as e:
        raise SubmissionRejected(f"{name} is corrupted: unreadable safetensors header ({str(e)[:80]})") from None
    spans.sort()
    end = 0
    for begin, stop in spans:
        if begin != end:
            raise SubmissionRejected(f"{name} is corrupted or truncated: tensor data overlaps or leaves gaps "
                                     f"(byte {begin}, expected {end})")  # fmt: skip
        end = stop
    if end != data_size:
        raise SubmissionRejected(f"{name} is corrupted or truncated: tensors cover {end} of {data_size} data bytes")
    return stats


def _check_utf8(raw: bytes, chunk: int = 1 << 20) -> None:
    """JSON is UTF-8 (the safetensors library refuses anything else); checked a chunk at a time, nothing kept."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    for i in range(0, len(raw), chunk):
        decoder.decode(view[i : i + chunk], final=i + chunk >= len(raw))


def _skip(raw: bytes, pos: int) -> int:
    return _WS.match(raw, pos).end()


def _expect(raw: bytes, pos: int, char: bytes) -> int:
    pos = _skip(raw, pos)
    if not raw.startswith(char, pos):
        raise _Malformed(f"expected {char.decode()!r} at byte {pos}")
    return _skip(raw, pos + 1)


def _string(raw: bytes, pos: int) -> tuple[bytes, int]:
    """The raw (still escaped) bytes of the JSON string at `pos`, and the position after it."""
    m = _STRING.match(raw, _skip(raw, pos))
    if m is None:
        raise _Malformed(f"expected a string at byte {pos}")
    return m.group(1), m.end()


def _name(escaped: bytes, file: str) -> str:
    if len(escaped) > MAX_NAME_BYTES:
        raise SubmissionRejected(f"{file}: a tensor name is over {MAX_NAME_BYTES} bytes")
    return json.loads(b'"' + escaped + b'"') if b"\\" in escaped else escaped.decode()


def _metadata(raw: bytes, pos: int, name: str) -> int:
    """`__metadata__`: a flat object of strings."""
    bad = SubmissionRejected(f"{name} is corrupted: __metadata__ must map strings to strings")
    if not raw.startswith(b"{", pos):
        raise bad
    pos = _skip(raw, pos + 1)
    if raw.startswith(b"}", pos):
        return pos + 1
    while True:
        _, pos = _string(raw, pos)
        pos = _expect(raw, pos, b":")
        if not raw.startswith(b'"', pos):
            raise bad
        _, pos = _string(raw, pos)
        pos = _skip(raw, pos)
        if raw.startswith(b",", pos):
            pos += 1
            continue
        if not raw.startswith(b"}", pos):
            raise bad
        return pos + 1


def _tensor(raw: bytes, pos: int, key: str, name: str, data_size: int, stats: TensorStats,
            spans: list[tuple[int, int]]) -> int:  # fmt: skip
    """One `{"dtype": str, "shape": [int...], "data_offsets": [int, int]}` object."""
    what = f"{name} is corrupted or truncated (tensor {_shown(key)} out of bounds or malformed)"
    if not raw.startswith(b"{", pos):
        raise SubmissionRejected(what)
    pos = _skip(raw, pos + 1)
    info: dict[str, Any] = {}
    while not raw.startswith(b"}", pos):
        field_name, pos = _string(raw, pos)
        pos = _expect(raw, pos, b":")
        pattern = {b"shape": _SHAPE, b"data_offsets": _OFFSETS}.get(field_name)
        if field_name == b"dtype" and raw.startswith(b'"', pos):
            dtype, pos = _string(raw, pos)
            info["dtype"] = dtype[:16].decode(errors="replace")
        elif pattern is not None and (m := pattern.match(raw, pos)):
            info[field_name.decode()] = [int(x) for x in m.group(1).split(b",")] if m.group(1) else []
            pos = m.end()
        else:
            raise SubmissionRejected(what)
        pos = _skip(raw, pos)
        if raw.startswith(b",", pos):
            pos = _skip(raw, pos + 1)
        elif not raw.startswith(b"}", pos):
            raise SubmissionRejected(what)
    offsets, shape, dtype = info.get("data_offsets"), info.get("shape"), info.get("dtype")
    if offsets is None or shape is None or dtype is None:
        raise SubmissionRejected(what)
    if dtype not in DTYPE_BITS:
        raise SubmissionRejected(f"{name}: tensor {_shown(key)} has an unknown dtype {_shown(dtype)}")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel = min(numel * d, 8 * data_size + 1)  # never a huge integer: past this it cannot fit the data anyway
    if not (begin <= end <= data_size) or numel * DTYPE_BITS[dtype] != 8 * (end - begin):
        raise SubmissionRejected(what)
    spans.append((begin, end))
    stats.tensors += 1
    stats.numel += numel
    if stats.tensors > MAX_TENSORS:
        raise SubmissionRejected(f"{name} holds over {MAX_TENSORS} tensors")
    if m := _LAYER.search(key):
        stats.layers.add(int(m.group(1)))
    if stats.embedding is None and key.endswith(EMBEDDING_NAMES):
        stats.embedding = (key, shape)
    return pos + 1


def _shown(text: str) -> str:
    return json.dumps(text if len(text) <= 60 else text[:57] + "...")


# -- the config against the weights ----------------------------------------------------------------------
ESTIMATE_SLACK = 2
"""The config's size estimate may exceed the weights' parameter count by this factor (estimates for unusual
attention layouts run high); a real inflation is orders of magnitude. Smaller ones meet the exact count."""


def config_sizes(config: dict[str, Any]) -> dict[str, int]:
    """`config_check.config_sizes`, a bad number refused as a submission's fault."""
    try:
        return _config_sizes(config)
    except ConfigSizeError as e:
        raise SubmissionRejected(str(e)) from e


def check_config_against_weights(config: dict[str, Any], stats: TensorStats, other_weight_bytes: int = 0) -> None:
    """Refuse a config that does not describe the weights beside it (see the module docstring).
    `other_weight_bytes`: weights whose headers cannot be read cheaply (`.bin`): at most 2 parameters a byte."""
    sizes = config_sizes(config)
    layers = sizes.get("layers")
    if stats.layers and layers is not None and stats.layers != set(range(layers)):
        held = f"{len(stats.layers)} layers (indices {min(stats.layers)}..{max(stats.layers)})"
        raise SubmissionRejected(f"config.json says {layers} hidden layers but the weights hold {held}: save the "
                                 "config that belongs to these weights")  # fmt: skip
    if stats.embedding is not None and "vocab" in sizes and "hidden" in sizes:
        name, shape = stats.embedding
        want = [sizes["vocab"], sizes.get("embedding", sizes["hidden"])]
        if shape != want:
            raise SubmissionRejected(f"config.json implies an embedding of shape {want} but {_shown(name)} has "
                                     f"shape {shape[:4]}: save the config that belongs to these weights")  # fmt: skip
    held = stats.numel + 2 * other_weight_bytes
    if "quantization_config" in config:  # packed low-bit weights: a parameter may take a single bit
        held = max(held, 8 * (stats.numel + other_weight_bytes))
    implied = estimated_parameters(sizes)
    if implied > ESTIMATE_SLACK * held + 1_000_000:
        raise SubmissionRejected(f"config.json implies about {implied:.3g} parameters but the weights hold "
                                 f"{held:.3g}: save the config that belongs to these weights")  # fmt: skip
