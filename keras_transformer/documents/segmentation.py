"""A plain-text document as a skeleton and its sentences: `segment(text, language)`, and `reassemble` to put the
translations back.

The skeleton is the document with each sentence replaced by its index: line breaks (every character
`str.splitlines` breaks at), blank lines, leading and trailing whitespace, indentation, the whitespace between
sentences, list bullets (``-``, ``*``, ``+``, ``•``, ``–``), numbering (``1.``, ``2)``, ``a)``, ``(iv)``), Markdown
heading and quote marks (``#``, ``>``) and pieces with no letter in them (``***``, ``2024``, ``| |``) stay text of
the skeleton, so they come back exactly where they were; only sentence text goes to the translator. A sentence never
spans a line break: each line is segmented on its own (a hard-wrapped paragraph is translated line by line, one
limit of this layout-exact design).

Sentences are found by `sentencex` (Wikimedia's segmenter, rules for about 300 languages by fallback chains),
chosen over `pysbd` on `bench/segmentation.py` (Multi30k test2016, 1,000 English sentences in 184 paragraphs of 3-8,
seed 0): with a final period given to the 52 captions that lack one, sentencex recovers 998 of 1,000 sentences
(99.8%; it keeps "a work of art. Busy Asian mall..." together, taking "art." for an abbreviation) and pysbd all
1,000, but sentencex segments about 600,000 paragraphs a CPU-second against pysbd's 480 (a thousandfold: pysbd's
cost rivals a small model's translation of the same text) and covers NLLB's 200 languages where pysbd has rules
for 22. Without those periods both recover 91% (no segmenter sees a boundary that is not marked).

Standard library and `sentencex` only.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import sentencex

# Every line break `str.splitlines` knows, "\r\n" as one.
_LINE_BREAK = re.compile(r"(\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])")
# A list or heading mark at the start of a line (after its indentation), followed by whitespace.
_MARKER = re.compile(r"(?:[-*+•‣◦▪●–—]|#{1,6}|>+|\d{1,3}[.)]|[a-z][.)]|[A-Z]\)|\((?:\d{1,3}|[a-zA-Z]|[ivxlc]{1,6})\)"
                     r"|[ivxlc]{1,6}[.)])(?=\s)\s+")
_WORD_CHARACTER = re.compile(r"[^\W\d_]")  # a letter of any script

# ISO 639-3 codes (NLLB's `eng_Latn` style) whose language has an ISO 639-1 code, which sentencex's rules are
# keyed by; other codes are given to sentencex as they are (its fallback chains cover many 3-letter codes).
_ISO_639_1 = dict(pair.split(":") for pair in """
acm:ar acq:ar aeb:ar afr:af ajp:ar aka:ak als:sq amh:am apc:ar ara:ar arb:ar ars:ar ary:ar arz:ar asm:as ayr:ay
azb:az aze:az azj:az bak:ba bam:bm bel:be ben:bn bod:bo bos:bs bul:bg cat:ca ces:cs ckb:ku cym:cy dan:da deu:de
dzo:dz ell:el eng:en epo:eo est:et eus:eu ewe:ee fao:fo fas:fa fij:fj fin:fi fra:fr fuv:ff gaz:om gla:gd gle:ga
glg:gl grn:gn guj:gu hat:ht hau:ha heb:he hin:hi hrv:hr hun:hu hye:hy ibo:ig ind:id isl:is ita:it jav:jv jpn:ja
kan:kn kas:ks kat:ka kaz:kk khk:mn khm:km kik:ki kin:rw kir:ky kmr:ku knc:kr kon:kg kor:ko lao:lo lav:lv lim:li
lin:ln lit:lt ltz:lb lug:lg lvs:lv mal:ml mar:mr mkd:mk mlg:mg mlt:mt mon:mn mri:mi msa:ms mya:my nep:ne nld:nl
nno:nn nob:nb npi:ne nya:ny oci:oc ory:or pan:pa pbt:ps pes:fa plt:mg pol:pl por:pt prs:fa pus:ps quy:qu ron:ro
run:rn rus:ru sag:sg san:sa sin:si slk:sk slv:sl smo:sm sna:sn snd:sd som:so sot:st spa:es sqi:sq srd:sc srp:sr
ssw:ss sun:su swa:sw swe:sv swh:sw tam:ta tat:tt tel:te tgk:tg tgl:tl tha:th tir:ti tsn:tn tso:ts tuk:tk tur:tr
twi:tw uig:ug ukr:uk urd:ur uzb:uz uzn:uz vie:vi wol:wo xho:xh ydd:yi yid:yi yor:yo zho:zh zsm:ms zul:zu
""".split())


def language_code(code: str | None) -> str:
    """The language code sentencex's rules are keyed by, from the codes models use: ``eng_Latn`` (NLLB),
    ``__en__`` (M2M-100), ``en-US``, ``pt_BR``, ``de``; None gives ``en``.

    Example:

    >>> language_code("eng_Latn"), language_code("__fr__"), language_code("pt-BR"), language_code("ace_Arab")
    ('en', 'fr', 'pt', 'ace')
    """
    if not code:
        return "en"
    base = re.split(r"[_\-]", code.strip("_").lower())[0]
    return _ISO_639_1.get(base, base)


@dataclasses.dataclass(frozen=True)
class Segmented:
    """A document cut into what stays and what is translated.

    Attributes:
        skeleton: the document's pieces in order: a `str` stays as it is, an `int` is the index of a sentence.
        sentences: the sentences, in document order, without the whitespace around them.

    Example:

    >>> segment("- One. Two.\\n").skeleton
    ('- ', 0, ' ', 1, '\\n')
    """

    skeleton: tuple[str | int, ...]
    sentences: tuple[str, ...]


def split_sentences(text: str, language: str | None = "en") -> list[tuple[int, int]]:
    """The `(start, end)` offsets of the sentences of one line of text (no line breaks), whitespace excluded.

    Args:
        text: the text.
        language: its language code (any form `language_code` reads).

    Example:

    >>> text = "Hello Dr. Smith.  How are you?"
    >>> [text[a:b] for a, b in split_sentences(text)]
    ['Hello Dr. Smith.', 'How are you?']
    """
    spans, position = [], 0
    for piece in sentencex.segment(language_code(language), text):
        stripped = piece.strip()
        if not stripped:
            continue
        start = text.find(stripped, position)
        if start < 0:  # the segmenter changed the text: keep the rest whole rather than lose any of it
            rest = text[position:].strip()
            if rest:
                start = text.index(rest, position)
                spans.append((start, start + len(rest)))
            return spans
        spans.append((start, start + len(stripped)))
        position = start + len(stripped)
    return spans


def has_words(text: str) -> bool:
    """True when `text` holds a letter of some script: what is worth translating (``***`` and ``2024`` are not).

    Example:

    >>> has_words("2024"), has_words("Straße"), has_words("東京")
    (False, True, True)
    """
    return _WORD_CHARACTER.search(text) is not None


def segment(text: str, language: str | None = "en") -> Segmented:
    """`text` as a skeleton and its sentences: `reassemble(result.skeleton, result.sentences)` is `text` again.

    Args:
        text: the document.
        language: the language of `text` (a code `language_code` reads), which picks the segmenter's rules.

    Returns:
        A `Segmented`.

    Example:

    >>> document = "  1. Take the dog out. Feed it.\\n\\n* Call Mr. Smith!\\n"
    >>> segment(document).sentences
    ('Take the dog out.', 'Feed it.', 'Call Mr. Smith!')
    >>> reassemble(segment(document).skeleton, ["A.", "B.", "C!"])
    '  1. A. B.\\n\\n* C!\\n'
    """
    skeleton: list[str | int] = []
    sentences: list[str] = []
    for piece in _LINE_BREAK.split(text):
        if not piece or _LINE_BREAK.fullmatch(piece):
            skeleton.append(piece)
            continue
        body_start = len(piece) - len(piece.lstrip())
        marker = _MARKER.match(piece, body_start)
        if marker:
            body_start = marker.end()
        body_end = len(piece.rstrip())
        skeleton.append(piece[:body_start])
        position = body_start
        body = piece[body_start:body_end]
        for start, end in split_sentences(body, language):
            start, end = start + body_start, end + body_start
            skeleton.append(piece[position:start])
            if has_words(piece[start:end]):
                skeleton.append(len(sentences))
                sentences.append(piece[start:end])
            else:
                skeleton.append(piece[start:end])
            position = end
        skeleton.append(piece[position:])
    return Segmented(skeleton=_merged(skeleton), sentences=tuple(sentences))


def _merged(skeleton: list[str | int]) -> tuple[str | int, ...]:
    """`skeleton` with adjacent strings joined and empty ones left out."""
    out: list[str | int] = []
    for piece in skeleton:
        if isinstance(piece, str):
            if not piece:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += piece
                continue
        out.append(piece)
    return tuple(out)


def reassemble(skeleton: Sequence[str | int], translations: Sequence[str]) -> str:
    """The document `skeleton` describes, each sentence index replaced by its translation.

    A translation's own line breaks become spaces and the whitespace around it is dropped, so the layout is the
    source's exactly.

    Raises:
        ValueError: fewer translations than the skeleton's sentences (both counts named).

    Example:

    >>> reassemble(("- ", 0, "\\n", 1), ["Ein Hund.", "Zwei\\nKatzen."])
    '- Ein Hund.\\nZwei Katzen.'
    """
    needed = 1 + max((piece for piece in skeleton if isinstance(piece, int)), default=-1)
    if len(translations) < needed:
        raise ValueError(f"reassemble: the skeleton has {needed} sentence(s) but {len(translations)} translation(s) "
                         "came back.")
    return "".join(piece if isinstance(piece, str) else _LINE_BREAK.sub(" ", translations[piece]).strip()
                   for piece in skeleton)
