"""One sentence per line: reading UTF-8 text files and streams the same way everywhere (no TensorFlow).

The corpus reader (training data), `evaluation.read_lines` (sources and
references to score, on any backend) and the `translate` command's stdin all
read lines with `iter_stream`, so a file means the same lines to each of them:

* plain or gzip-compressed, detected from the content, not the name (stdin too,
  decompressed as it arrives: `open_stream`);
* split on ``\\n`` only (a ``\\r`` before it is dropped), never on the other
  characters Python's ``str.splitlines`` or text-mode files break at (a lone
  ``\\r``, U+2028, ``\\x0b``, ...), which would shift one file against another;
* a leading UTF-8 byte-order mark is removed;
* invalid UTF-8 raises `InvalidUTF8Error` naming the file, the line and the
  byte, or with ``errors="replace"`` becomes U+FFFD.
"""

import gzip
import io
import os
from collections.abc import Iterable, Iterator
from typing import Any

ERROR_MODES = ("strict", "replace")
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


class InvalidUTF8Error(ValueError):
    """A line that is not valid UTF-8 (the message names the file, line and byte)."""


def open_binary(path: str | os.PathLike[str]) -> io.BufferedIOBase:
    """Opens `path` for binary reading, decompressing gzip when the file starts with its magic bytes."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory, not a file.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"File not found: {path}")
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


class _Rejoined(io.RawIOBase):
    """The bytes already read from a stream, then the rest of it, each read returning what has arrived."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            size = min(len(buffer), len(self._head))
            buffer[:size], self._head = self._head[:size], self._head[size:]
            return size
        read = getattr(self._rest, "read1", self._rest.read)  # read1: no waiting for a full buffer
        data = read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def open_stream(handle: Any) -> io.BufferedIOBase:
    """A binary stream as lines of bytes, gzip decompressed when it starts with gzip's magic bytes.

    What `open_binary` does for files, for a stream that cannot be read twice (stdin): the first two bytes are
    read and put back in front. Lines come out as the data arrives, so a pipe is translated while it is written.

    Args:
        handle: a binary stream with `read` (e.g. `sys.stdin.buffer`).

    Returns:
        A binary file object; iterate it for its lines.

    Example:

    >>> import gzip, io
    >>> list(open_stream(io.BytesIO(gzip.compress(b"one\\ntwo\\n"))))
    [b'one\\n', b'two\\n']
    """
    head = handle.read(len(_GZIP_MAGIC))
    stream = _Rejoined(head, handle)
    if head == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return io.BufferedReader(stream)


def _complete(handle: Iterable[bytes], name: str) -> Iterator[bytes]:
    """The lines of `handle`; gzip data that stops before its end is named (gzip raises a bare EOFError)."""
    try:
        yield from handle
    except EOFError:
        raise ValueError(f"{name}: the gzip data ends before its end marker (a truncated file?)") from None


def iter_stream(handle: Iterable[bytes], name: str, errors: str = "strict") -> Iterator[tuple[str, bool]]:
    """Yields the lines of a binary stream one at a time, as `(line, replaced)` (see the module docstring).

    Args:
        handle: an iterable of `bytes` lines, e.g. a file opened with "rb" or
            `sys.stdin.buffer`.
        name: what error messages call the stream (a path, "stdin").
        errors: ``"strict"`` raises `InvalidUTF8Error`; ``"replace"`` replaces
            invalid bytes with U+FFFD (and `replaced` is True for that line).

    Example:

    >>> import io
    >>> list(iter_stream(io.BytesIO(b"one\\r\\ntwo\\xff\\n"), "example", errors="replace"))
    [('one', False), ('two\\ufffd', True)]
    """
    if errors not in ERROR_MODES:
        raise ValueError(f"errors must be one of {ERROR_MODES}, got {errors!r}.")
    for number, raw in enumerate(_complete(handle, name), start=1):
        yield decode_line(raw, name, number, errors)


def decode_line(raw: bytes, name: str, number: int, errors: str = "strict") -> tuple[str, bool]:
    """One line as bytes, read the way `iter_stream` reads it: `(text, replaced)`.

    The line end (``\\n``, ``\\r\\n``) is dropped, and line 1's UTF-8 byte-order mark.

    Args:
        raw: the line's bytes, with or without its line end.
        name: what the error calls the file.
        number: the line's number (1-based), for the error and the byte-order mark.
        errors: ``"strict"`` raises `InvalidUTF8Error`; ``"replace"`` replaces bad bytes with U+FFFD.

    Example:

    >>> decode_line(b"caf\\xc3\\xa9\\r\\n", "a.txt", 7)
    ('café', False)
    >>> decode_line(b"caf\\xff\\n", "a.txt", 7, errors="replace")
    ('caf\\ufffd', True)
    """
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    if number == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError as error:
        if errors == "strict":
            raise InvalidUTF8Error(f"{name}:{number}: invalid UTF-8 (byte {error.start} of the line: "
                                   f"{raw[error.start:error.end]!r})") from None
        return raw.decode("utf-8", errors="replace"), True


def read_stream(handle: Iterable[bytes], name: str, errors: str = "strict") -> tuple[list[str], set[int]]:
    """All the lines of a binary stream (`iter_stream`).

    Returns:
        ``(lines, replaced)``: the lines without their line ends and the set of
        0-based indices of the lines in which bytes were replaced.

    Example:

    >>> import io
    >>> read_stream(io.BytesIO(b"one\\r\\ntwo\\xff\\x0bthree\\n"), "example", errors="replace")
    (['one', 'two\\ufffd\\x0bthree'], {1})
    """
    lines, replaced = [], set()
    for index, (line, bad) in enumerate(iter_stream(handle, name, errors)):
        lines.append(line)
        if bad:
            replaced.add(index)
    return lines, replaced


def complete_lines(handle: Iterable[bytes], name: str) -> Iterator[bytes]:
    """The lines of a binary file object; gzip data that stops before its end raises `ValueError` naming `name`.

    Example:

    >>> import io
    >>> list(complete_lines(io.BytesIO(b"a\\nb"), "x"))
    [b'a\\n', b'b']
    """
    return _complete(handle, name)


def count_lines(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> int:
    """The number of lines `read_file` reads from `path` (plain or gzip), counted without decoding or keeping them.

    Streams the file in chunks of `chunk_size` bytes and counts ``\\n``, plus a
    last line without one: what the corpus reader and `evaluation.read_lines`
    read, in a fraction of their time and memory (`keras-transformer train --dry-run`).

    Raises:
        ValueError: gzip data that stops before its end (the file is named).

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_bytes(b"one\\r\\ntwo\\x0bstill two\\nthree")
    >>> count_lines(path), len(read_file(path)[0])
    (3, 3)
    """
    count, last = 0, b"\n"
    with open_binary(path) as handle:
        for chunk in _complete(iter(lambda: handle.read(chunk_size), b""), os.fspath(path)):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def read_file(path: str | os.PathLike[str], errors: str = "strict") -> tuple[list[str], set[int]]:
    """`read_stream` on a file (plain or gzip); returns ``(lines, replaced)``.

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_bytes(b"\\xef\\xbb\\xbfone\\rstill one\\n")
    >>> read_file(path)
    (['one\\rstill one'], set())
    """
    with open_binary(path) as handle:
        return read_stream(handle, os.fspath(path), errors)
