"""What the leak audit reads besides the bytes as written: the agent's text normalised and decoded.

Hidden items written base64-, hex-, gzip-, zlib-, rot13-, URL- or UTF-16-encoded, joined with `_`, interleaved
with zero-width spaces, in Cyrillic or Greek look-alike letters, or reversed were found 0 of 40 times by a
verbatim search (issue 33). Here every text gets one normal form (`normalize`: NFKC, zero-width characters and
joiners removed, look-alike letters mapped to Latin, `_` and other joiners made spaces), and `views` yields the
texts a file may hide: the normal form, reversed, rot13, URL-decoded, UTF-16, gzip/zlib streams, and base64 and
hex runs (decoded, then viewed again, two levels deep). Bounded: at most `MAX_VIEW_BYTES` of a file are viewed
and at most `MAX_DECODED_BYTES` decoded from it; what was decoded is counted by kind for the report.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
import unicodedata
import urllib.parse
import zlib
from collections import Counter
from collections.abc import Iterator

MAX_VIEW_BYTES = 16 * 2**20
"""Of each file, the bytes that are normalised and decoded (the whole file is still searched as written)."""
MAX_DECODED_BYTES = 32 * 2**20
"""Bytes decoded from one file, all kinds together (a gzip bomb stops here)."""
MAX_DEPTH = 2

_INVISIBLE = re.compile("[%s]" % ("\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200c\u200d\u200e\u200f"
                                    "\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\u2066\u2067"
                                    "\u2068\u2069\u3164\ufeff\uffa0"))  # fmt: skip
_LOOKALIKES = dict(zip("АВЕКМНОРСТХаеорсухіјѕԁԛԝӏІЈЅԌԚԜΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοριυνκχτ",
                       "ABEKMHOPCTXaeopcyxijsdqwlIJSGQWABEZHIKMNOPTYXaopiuvkxt"))
_LOOKALIKE = re.compile("[%s]" % "".join(_LOOKALIKES))
"""Cyrillic and Greek letters drawn like Latin ones (the Unicode confusables that matter for English text)."""
_JOINERS = re.compile(r"[_\-.·•|/\\+~*=]+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/_-]{24,}={0,2}")
_HEX = re.compile(rb"(?:[0-9a-fA-F]{2}[\s:,]?){16,}")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")


def normalize(text: str) -> str:
    """One form for matching: NFKC (full-width and styled letters), invisible characters removed, look-alike
    letters made Latin, `_`/`-`/`.`-style joiners made spaces."""
    if not text.isascii():  # ASCII is its own NFKC form and holds no invisible or look-alike letter
        # Regular expressions, not str.translate: a per-character table lookup took seconds on a tokenizer.json.
        text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
        text = _LOOKALIKE.sub(lambda m: _LOOKALIKES[m.group()], text)
    return _JOINERS.sub(" ", text)


class Views:
    """The texts one file may hide, with a running count of what was decoded (`decoded`, by kind)."""

    def __init__(self) -> None:
        self.decoded: Counter[str] = Counter()
        self._budget = MAX_DECODED_BYTES

    def of(self, data: bytes, depth: int = 0) -> Iterator[tuple[str, str]]:
        """(kind, text) pairs: the normal form and its reversal, rot13, URL-decoded, UTF-16, then whatever the
        compressed, base64 and hex content decodes to."""
        data = data[:MAX_VIEW_BYTES]
        text = normalize(data.decode("utf-8", "replace"))
        yield "normalised", text
        yield "reversed", text[::-1]
        yield "rot13", codecs.decode(text, "rot13")
        if _PERCENT.search(text):
            yield self._count("url", normalize(urllib.parse.unquote_plus(text)))
        if utf16 := _utf16(data):
            yield self._count("utf-16", normalize(utf16))
        if depth >= MAX_DEPTH:
            return
        for kind, raw in self._decodings(data):
            self.decoded[kind] += 1
            yield from self.of(raw, depth + 1)

    def _count(self, kind: str, text: str) -> tuple[str, str]:
        self.decoded[kind] += 1
        return kind, text

    def _decodings(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        for kind, raw in _decompressed(data, self._budget):
            self._budget -= len(raw)
            yield kind, raw
        for pattern, kind, decode in ((_BASE64, "base64", _b64), (_HEX, "hex", _unhex)):
            for m in pattern.finditer(data):
                if self._budget <= 0:
                    return
                if (raw := decode(m.group())) is not None:
                    self._budget -= len(raw)
                    yield kind, raw


def _utf16(data: bytes) -> str | None:
    """UTF-16 text: a byte-order mark, or NUL in every other byte of a text-like start."""
    head = data[:4096]
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return data.decode("utf-16", "replace")
    if len(head) >= 8:
        if head[1::2].count(0) > 0.6 * len(head[1::2]) and head[0::2].count(0) < 0.1 * len(head[0::2]):
            return data.decode("utf-16-le", "replace")
        if head[0::2].count(0) > 0.6 * len(head[0::2]) and head[1::2].count(0) < 0.1 * len(head[1::2]):
            return data.decode("utf-16-be", "replace")
    return None


def _decompressed(data: bytes, budget: int) -> Iterator[tuple[str, bytes]]:
    """A gzip or zlib stream at the start of `data`, inflated up to `budget` bytes."""
    for kind, magic, wbits in (("gzip", (b"\x1f\x8b",), 31), ("zlib", (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda"), 15)):
        if data[:2] in magic and budget > 0:
            try:
                yield kind, zlib.decompressobj(wbits).decompress(data, budget)
            except zlib.error:
                pass


def _b64(run: bytes) -> bytes | None:
    try:
        return (base64.urlsafe_b64decode if b"-" in run or b"_" in run else base64.b64decode)(
            run + b"=" * (-len(run) % 4))  # fmt: skip
    except (binascii.Error, ValueError):
        return None


def _unhex(run: bytes) -> bytes | None:
    digits = re.sub(rb"[\s:,]", b"", run)
    try:
        return bytes.fromhex(digits[: len(digits) // 2 * 2].decode())
    except ValueError:
        return None
