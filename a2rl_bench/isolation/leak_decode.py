"""What the leak audit reads besides the bytes as written: the agent's text normalised and decoded.

Hidden items written base64-, hex-, gzip-, zlib-, rot13-, URL- or UTF-16-encoded, joined with `_`, interleaved
with zero-width spaces, in Cyrillic or Greek look-alike letters, or reversed were found 0 of 40 times by a
verbatim search (issue 33); so were, later, base32, base85/ascii85, zip, xz, bz2, UTF-32, numpy string arrays, PNG
text chunks, one character per line, reversed word order, each word reversed, lists of character codes, one-byte
XOR, Caesar shifts, tensors of character codes, and compressed or UTF-16 bytes printed amid the agent's output
(issue 43). Here every text gets one normal form (`normalize`: NFKC, zero-width characters and joiners removed,
look-alike letters mapped to Latin, `_` and other joiners made spaces), and `Views.of` yields the texts a file or
an output stream may hide:
- transforms of the text: the normal form, reversed, rot13, word order reversed, each word reversed, lines of one
  character joined, Caesar shifts whose result reads like English (common words), URL-decoded;
- transforms of the bytes: UTF-16 and UTF-32 (a byte-order mark, or runs of characters anywhere in the bytes: the
  storage of a numpy string array), runs of little-endian integers that are character codes (int16/32/64 tensors,
  `.pt` storages, safetensors tensors of integers), lists of character codes written as numbers, one-byte XOR
  (the key guessed from the most frequent bytes, taken as spaces);
- decodings, viewed again (two levels deep): gzip, zlib, xz and bz2 streams found anywhere in the bytes (not only
  at their start), zip members (`.npz`, `.pt`), PNG text chunks (tEXt, zTXt, iTXt), Python bytes literals
  (`b'\\x1f\\x8b...'`, what `print(gzip.compress(...))` writes), base64, base32, base85/ascii85 and hex runs.
Bounded: at most `MAX_VIEW_BYTES` of a file are viewed, at most `MAX_DECODED_BYTES` decoded from it (a bomb stops
there), at most `MAX_BLOBS` decodings tried per level; the audit's time budget is checked between views. What was
decoded is counted by kind for the report.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import codecs
import io
import lzma
import re
import struct
import unicodedata
import urllib.parse
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterator

MAX_VIEW_BYTES = 16 * 2**20
"""Of each file, the bytes that are normalised and decoded (the whole file is still searched as written)."""
MAX_DECODED_BYTES = 32 * 2**20
"""Bytes decoded from one file, all kinds together (a gzip bomb stops here)."""
MAX_DEPTH = 2
MAX_BLOBS = 2_000
"""Decodings tried per level of one file (a file of a million short base64 runs stops here)."""
MAX_STREAM_STARTS = 64
"""Compressed streams tried per kind and file (magic bytes anywhere)."""
MAX_TRANSFORM_BYTES = 4 * 2**20
"""Of each file or decoded blob, the part given the word-level transforms (word order, each word, one character
per line, Caesar, XOR, character-code lists): each is a whole extra search of its text."""
MAX_ZIP_MEMBERS = 256
MAX_PNG_CHUNKS = 4_096

_INVISIBLE = re.compile("[%s]" % ("\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b\u200c\u200d\u200e\u200f"
                                    "\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\u2066\u2067"
                                    "\u2068\u2069\u3164\ufeff\uffa0"))  # fmt: skip
_LOOKALIKES = dict(zip("АВЕКМНОРСТХаеорсухіјѕԁԛԝӏІЈЅԌԚԜΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοριυνκχτ",
                       "ABEKMHOPCTXaeopcyxijsdqwlIJSGQWABEZHIKMNOPTYXaopiuvkxt"))
_LOOKALIKE = re.compile("[%s]" % "".join(_LOOKALIKES))
"""Cyrillic and Greek letters drawn like Latin ones (the Unicode confusables that matter for English text)."""
_JOINERS = re.compile(r"[_\-.·•|/\\+~*=]+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/_-]{24,}={0,2}")
_BASE32 = re.compile(rb"[A-Z2-7]{24,}={0,6}")
_BASE85 = re.compile(rb"[0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]{25,}")
_ASCII85 = re.compile(rb"(?:<~)?[!-uz]{25,}(?:~>)?")
_HEX = re.compile(rb"(?:[0-9a-fA-F]{2}[\s:,]?){16,}")
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_BYTES_LITERAL = re.compile(rb"""b'((?:[^'\\\n]|\\.){8,})'|b"((?:[^"\\\n]|\\.){8,})\"""")
_CODE_LIST = re.compile(r"(?:(?:0x[0-9a-fA-F]{1,6}|\d{1,7})[\s,;]+){11,}(?:0x[0-9a-fA-F]{1,6}|\d{1,7})")
_ONE_CHAR_LINES = re.compile(r"(?:^.?\n){12,}", re.M)
# Little-endian integers that are character codes: runs of at least 12 (UTF-16, UTF-32, int16/32/64 tensors).
_CODES_LE = {
    2: re.compile(rb"(?:[\t\n\r\x20-\x7e]\x00){12,}"),
    4: re.compile(rb"(?:[\t\n\r\x20-\xff][\x00-\x2f]\x00\x00){12,}"),
    8: re.compile(rb"(?:[\t\n\r\x20-\x7e]\x00{7}){12,}"),
}
_CODES_BE = {
    2: re.compile(rb"(?:\x00[\t\n\r\x20-\x7e]){12,}"),
    4: re.compile(rb"(?:\x00\x00[\x00-\x2f][\t\n\r\x20-\xff]){12,}"),
}
_STREAM_MAGIC = (
    ("gzip", re.compile(rb"\x1f\x8b\x08")),
    ("zlib", re.compile(rb"\x78[\x01\x5e\x9c\xda]")),
    ("xz", re.compile(rb"\xfd7zXZ\x00")),
    ("bz2", re.compile(rb"BZh[1-9]1AY&SY")),
)
_COMMON_WORDS = re.compile(r"\b(?:the|and|of|to|is|how|many|what|in|for|with|are|has|each|if|does|was|it)\b")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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
        """(kind, text) pairs: the text's transforms, the bytes' transforms, then whatever the compressed,
        archived and encoded content decodes to (see the module docstring)."""
        data = data[:MAX_VIEW_BYTES]
        raw_text = data.decode("utf-8", "replace")
        text = normalize(raw_text)
        yield "normalised", text
        yield "reversed", text[::-1]
        yield "rot13", codecs.decode(text, "rot13")
        if _PERCENT.search(text):
            yield self._count("url", normalize(urllib.parse.unquote_plus(text)))
        for kind, decoded in _wide_texts(data):
            yield self._count(kind, normalize(decoded))
        part = raw_text[:MAX_TRANSFORM_BYTES]
        words = part.split()  # the words as written: normalising first would split "1.50" in two
        if len(words) > 1:
            yield "word order reversed", normalize(" ".join(reversed(words)))
            yield "each word reversed", normalize(" ".join(w[::-1] for w in words))
        if _ONE_CHAR_LINES.search(part):
            yield self._count("one character per line", normalize(_ONE_CHAR_LINES.sub(
                lambda m: m.group().replace("\n", "") + "\n", part)))  # fmt: skip
        yield from (self._count("caesar", t) for t in _caesar_shifts(text[:MAX_TRANSFORM_BYTES]))
        if codes := _code_lists(part):
            yield self._count("character codes", normalize(codes))
        head = data[:MAX_TRANSFORM_BYTES]
        for key in _xor_keys(head):
            yield self._count("xor", normalize(head.translate(_XOR_TABLES[key]).decode("utf-8", "replace")))
        if depth >= MAX_DEPTH:
            return
        for kind, raw in self._decodings(data):
            self.decoded[kind] += 1
            yield from self.of(raw, depth + 1)

    def _count(self, kind: str, text: str) -> tuple[str, str]:
        self.decoded[kind] += 1
        return kind, text

    def _decodings(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        tried = 0
        sources = (_streams(data, self._budget), _zip_members(data, self._budget), _png_texts(data, self._budget),
                   self._runs(data))  # fmt: skip
        for source in sources:
            for kind, raw in source:
                tried += 1
                if self._budget <= 0 or tried > MAX_BLOBS:
                    return
                self._budget -= len(raw)
                yield kind, raw

    def _runs(self, data: bytes) -> Iterator[tuple[str, bytes]]:
        for pattern, kind, decode in ((_BYTES_LITERAL, "bytes literal", _bytes_literal), (_BASE64, "base64", _b64),
                                      (_BASE32, "base32", _b32), (_BASE85, "base85", _b85),
                                      (_ASCII85, "ascii85", _a85), (_HEX, "hex", _unhex)):  # fmt: skip
            for m in pattern.finditer(data):
                if self._budget <= 0:
                    return
                if (raw := decode(m)) is not None and _worth_viewing(raw):
                    yield kind, raw


_MAGIC_STARTS = (b"\x1f\x8b", b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda", b"\xfd7zXZ", b"BZh", b"PK\x03\x04",
                 PNG_SIGNATURE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # fmt: skip


def _worth_viewing(raw: bytes) -> bool:
    """Whether a decoded run can hide text: mostly printable, compressed or archived, XORed text, or wide text.
    The runs of ordinary code and JSON that happen to decode (as base85, base32...) give noise: not viewed."""
    if len(raw) < 8:
        return False
    head = raw[:4096]
    if head.startswith(_MAGIC_STARTS):
        return True
    if len(set(head)) < 16:  # a run of one or a few bytes repeated: no text
        return False
    text = head.decode("utf-8", "replace")
    if sum(c.isprintable() or c in "\n\r\t" for c in text) >= 0.85 * len(text):
        return True
    return bool(_xor_keys(raw)) or any(p.search(head) for p in (*_CODES_LE.values(), *_CODES_BE.values()))


def _caesar_shifts(text: str) -> Iterator[str]:
    """The shifts of the letters (other than rot13, viewed anyway) under which the text holds common English
    words it did not hold before: a text shifted back reads as English, a text shifted away does not."""
    sample = text[:CAESAR_SAMPLE].lower()
    before = len(_COMMON_WORDS.findall(sample))
    shifts = Counter(_SHIFTED_WORD_SHIFT[w] for w in _SHIFTED_WORDS.findall(sample))  # one pass for every shift
    raw = None
    for shift, count in shifts.most_common(2):
        if count >= max(3, before // 20):
            raw = raw or text.encode("utf-8", "surrogatepass")  # bytes.translate: str.translate is 100x slower
            yield raw.translate(_SHIFT_BYTES[shift]).decode("utf-8", "replace")


def _shift_table(k: int) -> dict[int, int]:
    table = {}
    for base in (ord("a"), ord("A")):
        for i in range(26):
            table[base + i] = base + (i + k) % 26
    return table


_SHIFTS = {k: _shift_table(k) for k in range(26)}
_SHIFT_BYTES = {k: bytes(_SHIFTS[k].get(b, b) for b in range(256)) for k in range(26)}
CAESAR_SAMPLE = 256 * 1024
"""Characters of a text in which Caesar shifts are looked for."""
_WORDS = _COMMON_WORDS.pattern[len(r"\b(?:"):-len(r")\b")].split("|")
_SHIFTED_WORD_SHIFT = {w.translate(_SHIFTS[26 - k]): k for k in range(1, 26) if k != 13 for w in _WORDS}
"""A common word as it reads after a Caesar shift: the shift that brings it back."""
_SHIFTED_WORDS = re.compile(r"\b(?:%s)\b" % "|".join(sorted(_SHIFTED_WORD_SHIFT, key=len, reverse=True)))
_XOR_TABLES = {k: bytes(b ^ k for b in range(256)) for k in range(256)}


def _xor_keys(data: bytes) -> list[int]:
    """One-byte XOR keys worth trying: each of the two most frequent bytes taken for an XORed space (English text
    is about one space in six), where it is not a space already and the XORed text holds common English words
    (twice as many as the bytes as written)."""
    sample = data[: 1 << 20]
    if len(sample) < 24:
        return []
    keys = []
    head = sample[: 1 << 16]
    before = len(_COMMON_WORDS.findall(head.decode("latin-1").lower()))
    for byte, count in Counter(sample).most_common(2):
        key = byte ^ 0x20
        if key and count * 12 >= len(sample):  # XOR keeps letters letters for small keys: ask for English words
            after = len(_COMMON_WORDS.findall(head.translate(_XOR_TABLES[key]).decode("latin-1").lower()))
            if after >= max(3, 2 * before):
                keys.append(key)
    return keys


def _wide_texts(data: bytes) -> Iterator[tuple[str, str]]:
    """UTF-16 and UTF-32 text (a byte-order mark) and runs of character codes as 2-, 4- or 8-byte integers
    anywhere in the bytes (numpy `<U` arrays are UTF-32; tensors of codes are int16/32/64)."""
    if b"\x00" not in data:  # every wide form of text below holds NUL bytes
        return
    if data[:4] in (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE):
        yield "utf-32", data.decode("utf-32", "replace")
    elif data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        yield "utf-16", data.decode("utf-16", "replace")
    forms = ((2, "utf-16", _CODES_LE[2], "utf-16-le"), (2, "utf-16", _CODES_BE[2], "utf-16-be"),
             (4, "utf-32", _CODES_LE[4], "utf-32-le"), (4, "utf-32", _CODES_BE[4], "utf-32-be"),
             (8, "int64 codes", _CODES_LE[8], None))
    for width, kind, pattern, codec in forms:
        runs = []
        for m in pattern.finditer(data):
            start = m.start()
            runs.append(m.group()[::8].decode("latin-1") if codec is None else
                        data[start:start + (m.end() - start) // width * width].decode(codec, "replace"))  # fmt: skip
            if len(runs) >= MAX_BLOBS:
                break
        if runs:
            yield kind, "\n".join(runs)


def _code_lists(text: str) -> str:
    """Lists of numbers that are all printable character codes (`[ord(c) for c in q]`), as the text they code."""
    out = []
    for m in _CODE_LIST.finditer(text):
        try:
            codes = [int(n, 0) for n in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group())]
        except ValueError:
            continue
        if all(9 <= c < 0x110000 for c in codes):
            out.append("".join(chr(c) for c in codes))
        if len(out) >= MAX_BLOBS:
            break
    return "\n".join(out)


def _streams(data: bytes, budget: int) -> Iterator[tuple[str, bytes]]:
    """gzip, zlib, xz and bz2 streams starting anywhere in `data` (output printed amid other output), each
    inflated up to `budget` bytes."""
    for kind, magic in _STREAM_MAGIC:
        for n, m in enumerate(magic.finditer(data)):
            if n >= MAX_STREAM_STARTS or budget <= 0:
                break
            if (raw := _inflate(kind, memoryview(data)[m.start():], budget)):  # a view: no copy per start
                budget -= len(raw)
                yield kind, raw


def _inflate(kind: str, data: bytes | memoryview, budget: int) -> bytes | None:
    try:
        if kind in ("gzip", "zlib"):
            return zlib.decompressobj(31 if kind == "gzip" else 15).decompress(data, budget)
        if kind == "xz":
            return lzma.LZMADecompressor().decompress(data, max_length=budget)
        return bz2.BZ2Decompressor().decompress(data, max_length=budget)
    except (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError):
        return None


def _zip_members(data: bytes, budget: int) -> Iterator[tuple[str, bytes]]:
    """The members of a zip archive (`.npz`, `.pt`, a plain zip), each read up to the budget left."""
    if not data.startswith(b"PK\x03\x04"):
        return
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist()[:MAX_ZIP_MEMBERS]:
                if budget <= 0:
                    return
                with zf.open(info) as member:
                    raw = member.read(budget)
                budget -= len(raw)
                yield "zip", raw
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, OSError, EOFError, ValueError,
            RuntimeError, zlib.error, lzma.LZMAError):  # fmt: skip
        return


def _png_texts(data: bytes, budget: int) -> Iterator[tuple[str, bytes]]:
    """The text chunks of a PNG image: tEXt as written, zTXt and compressed iTXt inflated."""
    if not data.startswith(PNG_SIGNATURE):
        return
    at = len(PNG_SIGNATURE)
    for _ in range(MAX_PNG_CHUNKS):
        if at + 8 > len(data) or budget <= 0:
            return
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        at += 12 + length
        keyword, _, rest = body.partition(b"\x00")
        if kind == b"tEXt":
            raw = rest
        elif kind == b"zTXt":
            raw = _inflate("zlib", rest[1:], budget) or b""
        elif kind == b"iTXt" and len(rest) >= 2:
            compressed, text = rest[0], rest[2:].split(b"\x00", 2)[-1]
            raw = (_inflate("zlib", text, budget) or b"") if compressed else text
        else:
            continue
        budget -= len(raw)
        yield "png text", keyword + b" " + raw


def _bytes_literal(m: re.Match) -> bytes | None:
    try:
        return codecs.escape_decode(m.group(1) if m.group(1) is not None else m.group(2))[0]
    except (ValueError, UnicodeDecodeError):
        return None


def _b64(m: re.Match) -> bytes | None:
    run = m.group()
    try:
        return (base64.urlsafe_b64decode if b"-" in run or b"_" in run else base64.b64decode)(
            run + b"=" * (-len(run) % 4))  # fmt: skip
    except (binascii.Error, ValueError):
        return None


def _b32(m: re.Match) -> bytes | None:
    run = m.group().rstrip(b"=")
    try:
        return base64.b32decode(run[: len(run) // 8 * 8] if len(run) % 8 else run)
    except (binascii.Error, ValueError):
        return None


def _b85(m: re.Match) -> bytes | None:
    run = m.group()
    try:
        return base64.b85decode(run[: len(run) // 5 * 5] if len(run) % 5 else run)
    except (ValueError, binascii.Error):
        return None


def _a85(m: re.Match) -> bytes | None:
    run = m.group()
    try:
        return base64.a85decode(run, adobe=run.startswith(b"<~") and run.endswith(b"~>"))
    except (ValueError, binascii.Error):
        return None


def _unhex(m: re.Match) -> bytes | None:
    digits = re.sub(rb"[\s:,]", b"", m.group())
    try:
        return bytes.fromhex(digits[: len(digits) // 2 * 2].decode())
    except ValueError:
        return None
