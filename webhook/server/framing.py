"""Where one HTTP/1.1 request ends in a byte buffer, without parsing more than that. Pure.

The server's event loop reads a request whole, under a deadline, before a thread is given it
(a slow or stalled client must not hold a thread: webhook.server.worker). To know when it
has the whole request it needs only the framing of RFC 9112 section 6: the end of the header
block, then ``Content-Length`` bytes or a chunked body up to its last chunk and trailers.
Everything else (methods, header syntax, chunk extensions) is left to gunicorn's parser, which
parses the buffered bytes afterwards; a buffer whose framing is broken is handed over as it is,
so that parser (and the app) answers it with a 400 naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class State(Enum):
    INCOMPLETE = "incomplete"
    """More bytes are needed."""
    COMPLETE = "complete"
    """``end`` bytes form one request."""
    TOO_LARGE = "too_large"
    """The body is (or is declared) longer than the limit: answer 413 without reading it."""
    HEADERS_TOO_LARGE = "headers_too_large"
    """No end of the header block within the limit: answer 431."""
    MALFORMED = "malformed"
    """The framing is broken; hand the bytes to the parser, which says how (400)."""


@dataclass(frozen=True, slots=True)
class Framing:
    state: State
    end: int = 0
    """Bytes of the buffer that make this request (COMPLETE, MALFORMED: all bytes read so far)."""
    expects_continue: bool = False
    """The client sent ``Expect: 100-continue`` and waits for the interim answer before its body."""
    declared_length: int | None = None
    """The body length the headers declare (None for chunked or no body)."""
    body_start: int = 0
    """Where the body starts (after the header block), once the header block is complete."""


_CRLF = b"\r\n"
_HEADER_END = b"\r\n\r\n"
_MAX_CHUNK_LINE = 4096


def frame(buffer: bytes | bytearray, *, max_header_bytes: int, max_body_bytes: int) -> Framing:
    """How far ``buffer`` holds one complete request (empty lines before it included)."""
    # No copy of the buffer: it is framed again after every read, and a copy per read made a large
    # body cost its size squared in copying (and twice its size in memory at each read).
    data = buffer
    start = 0
    while data.startswith(_CRLF, start):  # RFC 9112 2.2: ignore empty lines before a request line
        start += 2
    header_end = data.find(_HEADER_END, start)
    if header_end < 0:
        if len(data) - start > max_header_bytes:
            return Framing(State.HEADERS_TOO_LARGE)
        return Framing(State.INCOMPLETE)
    if header_end - start > max_header_bytes:
        return Framing(State.HEADERS_TOO_LARGE)
    body_start = header_end + len(_HEADER_END)
    fields = _fields(data[start:header_end])
    if fields is None:
        return Framing(State.MALFORMED, end=len(data), body_start=body_start)
    lengths, codings, expects = fields
    if codings:
        if lengths or codings[-1] != "chunked":
            # Both framings, or a coding other than chunked last: the parser refuses it (400).
            return Framing(State.MALFORMED, end=len(data), body_start=body_start)
        return _chunked(data, body_start, max_body_bytes, expects)
    if len(set(lengths)) > 1:
        return Framing(State.MALFORMED, end=len(data), body_start=body_start)
    length = 0
    if lengths:
        value = lengths[0]
        if not value.isdigit() or len(value) > 18:
            return Framing(State.MALFORMED, end=len(data), body_start=body_start)
        length = int(value)
    if length > max_body_bytes:
        return Framing(State.TOO_LARGE, declared_length=length, body_start=body_start)
    if len(data) - body_start < length:
        return Framing(State.INCOMPLETE, expects_continue=expects, declared_length=length, body_start=body_start)
    return Framing(State.COMPLETE, end=body_start + length, declared_length=length, body_start=body_start)


def too_large(limit: int, length: int | None = None) -> str:
    """The 413's message, one wording for every path that refuses a body over ``limit`` bytes
    (``length``: the declared size, when the request declared one)."""
    return (f"body of {length} bytes exceeds the {limit}-byte limit" if length is not None
            else f"body exceeds the {limit}-byte limit")


def _fields(block: bytes) -> tuple[list[str], list[str], bool] | None:
    """(Content-Length values, transfer codings, expects 100-continue), or None if a line has no colon."""
    lines = block.split(_CRLF)
    lengths: list[str] = []
    codings: list[str] = []
    expects = False
    for line in lines[1:]:  # lines[0] is the request line
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        key = name.strip().lower()
        text = value.strip().decode("latin-1")
        if key == b"content-length":
            lengths.extend(part.strip() for part in text.split(","))
        elif key == b"transfer-encoding":
            codings.extend(part.strip().lower() for part in text.split(",") if part.strip())
        elif key == b"expect":
            expects = text.lower() == "100-continue"
    return lengths, codings, expects


def _chunked(data: bytes | bytearray, position: int, max_body_bytes: int, expects: bool) -> Framing:
    total = 0
    while True:
        line_end = data.find(_CRLF, position)
        if line_end < 0:
            if len(data) - position > _MAX_CHUNK_LINE:
                return Framing(State.MALFORMED, end=len(data))
            return Framing(State.INCOMPLETE, expects_continue=expects and total == 0)
        size_text = data[position:line_end].split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            return Framing(State.MALFORMED, end=len(data))
        size = int(size_text, 16)
        total += size
        if total > max_body_bytes:
            return Framing(State.TOO_LARGE)
        position = line_end + 2
        if size == 0:
            return _trailers(data, position)
        if len(data) < position + size + 2:
            return Framing(State.INCOMPLETE)
        if data[position + size:position + size + 2] != _CRLF:
            return Framing(State.MALFORMED, end=len(data))
        position += size + 2


def _trailers(data: bytes | bytearray, position: int) -> Framing:
    if data.startswith(_CRLF, position):
        return Framing(State.COMPLETE, end=position + 2)
    end = data.find(_HEADER_END, position)
    if end < 0:
        if len(data) - position > _MAX_CHUNK_LINE:
            return Framing(State.MALFORMED, end=len(data))
        return Framing(State.INCOMPLETE)
    return Framing(State.COMPLETE, end=end + len(_HEADER_END))
