"""A line as every engine reads it: text in (`str`, or UTF-8 `bytes`: `Lines`), invalid UTF-8 replaced
(`clean_line`), blank or not (`is_blank`), and a forced target prefix's ids checked (`check_prefix_ids`). Standard
library only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias

# Lines in: `str`, or UTF-8 `bytes`.
Lines: TypeAlias = Iterable[str | bytes]
# A target prefix: one text for every line, or a list of one per line (None: no prefix).
Prefixes: TypeAlias = str | bytes | Sequence[str | bytes] | None

# What a blank line may hold: the whitespace TensorFlow's `tf.strings.strip` removes, for every engine alike.
ASCII_WHITESPACE = " \t\n\v\f\r"


def clean_line(line: str | bytes, caller: str = "translator") -> str:
    """A line as text, the one rule every engine reads lines by: invalid UTF-8 becomes U+FFFD.

    `bytes` are decoded as UTF-8. In a `str`, the lone surrogates by which Python keeps the undecodable bytes of
    stdin, argv and file names ("surrogateescape") are those bytes again, and any other lone surrogate its invalid
    3-byte form; either way they are invalid UTF-8, each byte replaced as Python's "replace" error handler does
    (TensorFlow's `unicode_transcode` replaces the same bytes).

    Raises:
        TypeError: neither `str` nor `bytes` (the type named).

    Example:

    >>> clean_line("a \\ud800 b"), clean_line(b"x\\xffy"), clean_line("Ein Hund.")
    ('a \ufffd\ufffd\ufffd b', 'x\ufffdy', 'Ein Hund.')
    """
    if isinstance(line, bytes):
        data = line
    elif isinstance(line, str):
        try:
            data = line.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = line.encode("utf-8", "surrogatepass")
    else:
        raise TypeError(f"{caller}: sentences must be str (or UTF-8 bytes), got {type(line).__name__}: {line!r}.")
    return data.decode("utf-8", "replace")


def is_blank(text: str) -> bool:
    """True for a line with nothing to translate: empty, or ASCII whitespace only (`ASCII_WHITESPACE`).

    Example:

    >>> is_blank(" \\t"), is_blank("\\u00a0"), is_blank("a")
    (True, False, False)
    """
    return not text.strip(ASCII_WHITESPACE)


def with_first_token(lines: Iterable[str], token: str, caller: str = "translator") -> list[str]:
    """Each cleaned line with `token` (a language token) first; blank lines stay as they are.

    Example:

    >>> with_first_token(["A dog.", ""], "<2de>")
    ['<2de> A dog.', '']
    """
    return [line if is_blank(clean_line(line, caller)) else f"{token} {clean_line(line, caller)}" for line in lines]


def check_prefix_ids(caller: str, text: str, ids: list[int], unk_id: int | None, max_target_length: int) -> list[int]:
    """`ids`, a prefix's target ids, or a `ValueError` naming the prefix: one holding the unk id (text the target
    vocabulary lacks: forcing it would force unk), or one of `max_target_length` tokens or more (no room left for
    a decoded token).

    Example:

    >>> check_prefix_ids("translate", "Ein Hund", [57, 980], unk_id=1, max_target_length=128)
    [57, 980]
    >>> check_prefix_ids("translate", "Ein ☃", [57, 1], unk_id=1, max_target_length=128)
    Traceback (most recent call last):
    ...
    ValueError: translate: the target prefix 'Ein ☃' holds text the target vocabulary does not have (token 2 ...
    """
    if unk_id is not None and unk_id in ids:
        raise ValueError(f"{caller}: the target prefix {text!r} holds text the target vocabulary does not have "
                         f"(token {ids.index(unk_id) + 1} of {len(ids)} is unk); forcing it would force unk.")
    if len(ids) >= max_target_length:
        raise ValueError(f"{caller}: the target prefix {text[:40]!r}... has {len(ids)} tokens; the model produces at "
                         f"most {max_target_length}, so a prefix has at most {max_target_length - 1}.")
    return ids
