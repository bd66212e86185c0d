"""Sentences longer than a model takes, cut into parts it does take: never truncated, never dropped.

`cut(sentence, budget, count_tokens)` gives consecutive pieces of the sentence, each of at most `budget` tokens by
`count_tokens` (the model's source tokenizer, or an estimate), cutting where a clause ends when it can:

1. after a semicolon or a colon (``;``, ``:`` followed by a space, or their full-width forms);
2. after a comma (``,``, ``،``, or the ideographic ``、`` and ``，``);
3. before a dash set off by spaces (``–``, ``—``, `` - ``);
4. between any two words (a split that no punctuation marks, the last resort before the next one);
5. between characters, for a run without spaces longer than the budget (Chinese, Japanese or Thai text, a URL).

At each level the pieces are packed greedily, left to right, into parts within the budget (the longest run of pieces
that fits found by bisection); a piece over it alone is cut at the next level. Every character of the sentence
but the whitespace at the cuts is in exactly one part, in order. The parts are translated in order (in the same
batch call as the other sentences) and their translations joined by `join_parts`: with a space, or with nothing
for a target language written without spaces between words (`SPACELESS`: Chinese, Japanese, Thai, Lao, Khmer,
Burmese, Tibetan, Dzongkha).

Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

SPACELESS = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo", "dz", "yue", "wuu"})

_LEVELS = (
    re.compile(r"(?<=[;:])\s+|(?<=[；：])\s*"),
    re.compile(r"(?<=[,،])\s+|(?<=[、，])\s*"),
    re.compile(r"\s+(?=[–—―-]+\s)"),
    re.compile(r"\s+"),
)


def cut(sentence: str, budget: int, count_tokens: Callable[[str], int]) -> list[str]:
    """`sentence` in consecutive parts of at most `budget` tokens each (one part when it fits).

    Args:
        sentence: the text, without line breaks.
        budget: the most tokens a part may have (the model's length limit less room for its special tokens).
        count_tokens: a text's token count, e.g. the length of the model's source tokenization.

    Returns:
        The parts, stripped, in order; `" ".join(parts).split() == sentence.split()`.

    Raises:
        ValueError: a budget under one token.

    Example:

    >>> words = lambda text: len(text.split())
    >>> cut("We came; we saw, and we left at once", 4, words)
    ['We came;', 'we saw,', 'and we left at', 'once']
    """
    if budget < 1:
        raise ValueError(f"cut: a token budget of {budget}; a part needs room for one token at least.")
    sentence = sentence.strip()
    if not sentence or count_tokens(sentence) <= budget:
        return [sentence] if sentence else []
    return [sentence[a:b] for a, b in _cut(sentence, 0, len(sentence), 0, budget, count_tokens)]


def _cut(text: str, start: int, end: int, level: int, budget: int,
         count_tokens: Callable[[str], int]) -> list[tuple[int, int]]:
    """The `(start, end)` spans of `text[start:end]`'s parts, cut at `_LEVELS[level]` and the levels after it."""
    if level == len(_LEVELS):
        return _cut_characters(text, start, end, budget, count_tokens)
    pieces, position = [], start
    for match in _LEVELS[level].finditer(text, start, end):
        if match.start() > position:
            pieces.append((position, match.start()))
        position = match.end()
    if position < end:
        pieces.append((position, end))
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(pieces):
        first = pieces[i][0]
        if count_tokens(text[first:pieces[i][1]]) > budget:  # one piece too long: its parts at the next level
            spans += _cut(text, first, pieces[i][1], level + 1, budget, count_tokens)
            i += 1
            continue
        low, high = i, len(pieces) - 1  # the last piece that fits with the ones from i lies in [low, high]
        while low < high:  # by bisection: a few counts per part, however many pieces (a 2,000-word line)
            middle = (low + high + 1) // 2
            if count_tokens(text[first:pieces[middle][1]]) <= budget:
                low = middle
            else:
                high = middle - 1
        spans.append((first, pieces[low][1]))
        i = low + 1
    return spans


def _cut_characters(text: str, start: int, end: int, budget: int,
                    count_tokens: Callable[[str], int]) -> list[tuple[int, int]]:
    """`text[start:end]` cut between characters: each part the longest prefix of the rest within the budget (one
    character at least), found by bisection."""
    spans = []
    while start < end:
        low, high = start + 1, end  # the longest fitting end lies in [low, high]
        while low < high:
            middle = (low + high + 1) // 2
            if count_tokens(text[start:middle]) <= budget:
                low = middle
            else:
                high = middle - 1
        spans.append((start, low))
        start = low
    return spans


def join_parts(parts: Sequence[str], language: str | None = None) -> str:
    """The translations of one sentence's parts as one text: joined by a space, or by nothing when `language` (an
    ISO 639-1 code, the target's) is written without spaces (`SPACELESS`).

    Example:

    >>> join_parts(["Wir kamen;", "wir sahen."]), join_parts(["我们来了，", "我们看见了。"], "zh")
    ('Wir kamen; wir sahen.', '我们来了，我们看见了。')
    """
    separator = "" if language in SPACELESS else " "
    return separator.join(part.strip() for part in parts if part.strip())
