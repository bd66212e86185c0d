"""`translate_document`: a whole document through any engine's batch translation, its layout kept.

The document is read (`read_document`: UTF-8, not binary, within `MAX_DOCUMENT_BYTES`), cut into sentences
(`segmentation` for plain text, `markup` for HTML and XML), each sentence over the token budget cut into parts
(`cutting`): `plan_document` does this once, and its `DocumentPlan` holds the parts (`lines`). Then
`translate_plan` sends every part of the whole document to `translate_lines` in **one call**, so the engine
batches them by length across the document, and puts the translations back where their sentences were.
`translate_document` is the two in a row; a server that counts a document's sentences before it translates them
plans once and translates the plan.

Standard library, numpy, lxml and sentencex only: `translate_lines` is all it knows of a model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from keras_transformer.documents.alignment import Aligner
from keras_transformer.documents.cutting import cut, join_parts
from keras_transformer.documents.markup import read_markup
from keras_transformer.documents.segmentation import language_code, reassemble, segment
from keras_transformer.errors import DocumentError, format_size

FORMATS = ("text", "html", "xml")
# `progress(done, total)`: parts of sentences translated so far, of all the document's parts.
Progress = Callable[[int, int], None]
MAX_DOCUMENT_BYTES = 8 * 2**20  # a book is about 1 MiB of text; past this, split the file (and keep memory bounded)
# The most tokens of a part where the model's limit is unknown: 128 positions less eos and a language token.
DEFAULT_MAX_TOKENS = 126


def read_document(text: str | bytes, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """`text` as a `str`, or a `DocumentError` naming what is wrong with it.

    Bytes are decoded as UTF-8; a `str` holding lone surrogates (the undecodable bytes of a file read with
    ``errors="surrogateescape"``) is checked as those bytes.

    Raises:
        DocumentError: over `max_bytes` (the limit named), a NUL byte (a binary file; its offset named), or invalid
            UTF-8 (the byte and its offset named).

    Example:

    >>> read_document(b"Ein Hund.")
    'Ein Hund.'
    >>> read_document(b"caf\\xe9 noir")
    Traceback (most recent call last):
    ...
    keras_transformer.errors.DocumentError: the document is not valid UTF-8: byte 0xe9 at byte offset 3 ...
    """
    if isinstance(text, str):
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as error:
            raise DocumentError(f"the document holds a lone surrogate (U+{ord(text[error.start]):04X}) at character "
                                f"{error.start}: not text that UTF-8 can carry.") from None
    elif isinstance(text, (bytes, bytearray)):
        data = bytes(text)
    else:
        raise TypeError(f"translate_document takes a str (or UTF-8 bytes), got {type(text).__name__}.")
    if len(data) > max_bytes:
        raise DocumentError(f"the document is {format_size(len(data))}, over the limit of {format_size(max_bytes)} "
                            f"(max_bytes={max_bytes}); split it into smaller documents.")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise DocumentError(f"the document looks binary (a NUL byte at byte offset {nul}); give a text, HTML or XML "
                            "file in UTF-8.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DocumentError(f"the document is not valid UTF-8: byte 0x{data[error.start]:02x} at byte offset "
                            f"{error.start} ({error.reason}); convert it to UTF-8 first.") from None


def estimate_tokens(text: str) -> int:
    """A generous token count for when the model's tokenizer is not at hand: one per 3 bytes of UTF-8 (a subword
    tokenizer gives about one per 4-5 bytes of English, one per CJK character).

    Example:

    >>> estimate_tokens("A dog runs."), estimate_tokens("東京")
    (4, 2)
    """
    return math.ceil(len(text.encode("utf-8")) / 3)


def translate_sentences(translate_lines: Callable[[list[str]], list[str]], sentences: Sequence[str],
                        max_tokens: int = DEFAULT_MAX_TOKENS, count_tokens: Callable[[str], int] | None = None,
                        target_lang: str | None = None, progress: Progress | None = None, chunk_size: int = 64,
                        details: list[dict[str, Any]] | None = None,
                        on_sentence: Callable[[str, list[str], str], None] | None = None) -> list[str]:
    """One translation per sentence, from one call of `translate_lines` over every sentence's parts (`cut`).

    With `progress`, the parts go to `translate_lines` in chunks of `chunk_size` instead, shortest first (in
    word counts, as an engine forms its batches by length: the batches are the same), and `progress(done, total)`
    is called before the first chunk and after each.

    Args:
        translate_lines: a batch translation (a list of `str` in, as many `str` out, in order).
        sentences: the sentences.
        max_tokens: the most tokens a part may have.
        count_tokens: a text's token count; None: `estimate_tokens`.
        target_lang: the target language (any code `language_code` reads), which says how parts are joined
            (`join_parts`); None: with a space.
        progress: called with `(parts done, parts in all)` as the translation goes; None: one call, no report.
        chunk_size: parts per call of `translate_lines` with `progress`.
        details: a list that gets one `{"source", "translation", "parts"}` dict per sentence, in order.
        on_sentence: called per sentence, in order, after all are translated, with the sentence, the parts it was
            translated in (the `translate_lines` lines, in order) and its translation.

    Raises:
        ValueError: `translate_lines` gave another number of translations than it was given sentences.

    Example:

    >>> translate_sentences(lambda lines: [line.upper() for line in lines], ["We came; we saw."], max_tokens=3,
    ...                     count_tokens=lambda text: len(text.split()))
    ['WE CAME; WE SAW.']
    """
    parts = [cut(sentence, max_tokens, count_tokens or estimate_tokens) for sentence in sentences]
    return translate_parts(translate_lines, sentences, parts, target_lang, progress, chunk_size, details, on_sentence)


def translate_parts(translate_lines: Callable[[list[str]], list[str]], sentences: Sequence[str],
                    parts: Sequence[Sequence[str]], target_lang: str | None = None, progress: Progress | None = None,
                    chunk_size: int = 64, details: list[dict[str, Any]] | None = None,
                    on_sentence: Callable[[str, list[str], str], None] | None = None) -> list[str]:
    """`translate_sentences` of sentences already cut: `parts[i]`, sentence i's parts (`cut`), in order.

    Example:

    >>> translate_parts(lambda lines: [line.upper() for line in lines], ["We came; we saw."],
    ...                 [["We came;", "we saw."]])
    ['WE CAME; WE SAW.']
    """
    flat = [part for group in parts for part in group]
    if progress is None:
        translated = _checked(flat, translate_lines(flat) if flat else [])
    else:
        translated = [""] * len(flat)
        order = sorted(range(len(flat)), key=lambda i: len(flat[i].split()))  # stable: as engines order batches
        progress(0, len(flat))
        for start in range(0, len(order), max(1, int(chunk_size))):
            chunk = order[start:start + max(1, int(chunk_size))]
            for i, line in zip(chunk, _checked(chunk, translate_lines([flat[i] for i in chunk]))):
                translated[i] = line
            progress(start + len(chunk), len(flat))
    language = language_code(target_lang) if target_lang else None
    out, position = [], 0
    for sentence, group in zip(sentences, parts):
        out.append(join_parts(translated[position:position + len(group)], language))
        position += len(group)
        if details is not None:
            details.append({"source": sentence, "translation": out[-1], "parts": len(group)})
        if on_sentence is not None:
            on_sentence(sentence, list(group), out[-1])
    return out


def _checked(sent: Sequence[Any], translated: Sequence[str]) -> list[str]:
    """`translated` as a list, or a `ValueError` when it does not hold one translation per sentence `sent`."""
    translated = list(translated)
    if len(translated) != len(sent):
        raise ValueError(f"translate_document: {len(sent)} sentence(s) sent, {len(translated)} translation(s) came "
                         "back.")
    return translated


@dataclasses.dataclass
class DocumentPlan:
    """A document read, segmented and its long sentences cut (`plan_document`): what goes to the engine, and how
    the translations go back (`translate_plan`, once: a markup document's tree takes the translation).

    Attributes:
        format: "text", "html" or "xml".
        text: the document as read.
        sentences: its sentences, in document order (a markup document's attribute texts among them).
        parts: per sentence, the parts it is translated in (`cut`: the sentence alone unless over the budget).
        target_lang: the translation's language, for joining a cut sentence's parts.

    Example:

    >>> plan = plan_document("A dog runs. A cat.\\n\\n- Done.")
    >>> plan.sentences, plan.lines
    (('A dog runs.', 'A cat.', 'Done.'), ['A dog runs.', 'A cat.', 'Done.'])
    """

    format: str
    text: str
    sentences: tuple[str, ...]
    parts: tuple[tuple[str, ...], ...]
    target_lang: str | None
    # (translations, aligner) -> the document; None: a blank document, given back as it is
    finish: Callable[[list[str], Aligner | None], str] | None = dataclasses.field(default=None, repr=False)

    @property
    def lines(self) -> list[str]:
        """Every part of every sentence, in document order: what the engine translates."""
        return [part for group in self.parts for part in group]


def plan_document(text: str | bytes, format: str = "text", source_lang: str | None = None,
                  max_tokens: int | None = None, count_tokens: Callable[[str], int] | None = None,
                  target_lang: str | None = None, attributes: Sequence[str] = ("alt", "title"),
                  max_bytes: int = MAX_DOCUMENT_BYTES) -> DocumentPlan:
    """`text` read, segmented into sentences and each sentence over the budget cut into parts: the arguments as
    `translate_document`'s.

    Raises:
        DocumentError: as `translate_document`.
    """
    if format not in FORMATS:
        raise DocumentError(f"unknown document format {format!r}; choose one of {', '.join(FORMATS)}.")
    text = read_document(text, max_bytes)
    if not text.strip():
        return DocumentPlan(format, text, (), (), target_lang)
    budget = DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens)
    if format == "text":
        segmented = segment(text, source_lang)
        sentences = list(segmented.sentences)

        def finish(translations: list[str], align: Aligner | None) -> str:
            return reassemble(segmented.skeleton, translations)
    else:
        markup = read_markup(text, source_lang, format=format, attributes=attributes)
        sentences, finish = markup.sentences, markup.render
    parts = tuple(tuple(cut(sentence, budget, count_tokens or estimate_tokens)) for sentence in sentences)
    return DocumentPlan(format, text, tuple(sentences), parts, target_lang, finish)


def translate_plan(translate_lines: Callable[[list[str]], list[str]], plan: DocumentPlan,
                   align: Aligner | None = None, progress: Progress | None = None, chunk_size: int = 64,
                   details: list[dict[str, Any]] | None = None,
                   on_sentence: Callable[[str, list[str], str], None] | None = None) -> str:
    """The document of `plan` translated: its `lines` through `translate_lines` (one call; with `progress`, in
    chunks as `translate_parts` sends them), the translations put back in its layout or markup. The other
    arguments as `translate_document`'s.

    Example:

    >>> plan = plan_document("A dog runs. A cat.\\n\\n- Done.")
    >>> print(translate_plan(lambda lines: [line.upper() for line in lines], plan))
    A DOG RUNS. A CAT.
    <BLANKLINE>
    - DONE.
    """
    if plan.finish is None:
        return plan.text
    translations = translate_parts(translate_lines, plan.sentences, plan.parts, plan.target_lang, progress,
                                   chunk_size, details, on_sentence)
    return plan.finish(translations, align)


def translate_document(translate_lines: Callable[[list[str]], list[str]], text: str | bytes, format: str = "text",
                       source_lang: str | None = None, max_tokens: int | None = None,
                       count_tokens: Callable[[str], int] | None = None, align: Aligner | None = None,
                       target_lang: str | None = None, attributes: Sequence[str] = ("alt", "title"),
                       max_bytes: int = MAX_DOCUMENT_BYTES, progress: Progress | None = None, chunk_size: int = 64,
                       details: list[dict[str, Any]] | None = None,
                       on_sentence: Callable[[str, list[str], str], None] | None = None) -> str:
    """`text` translated sentence by sentence, with its layout (plain text) or its markup (HTML, XML) kept:
    `translate_plan` of `plan_document`.

    Args:
        translate_lines: any engine's batch translation, e.g. a translator's `translate_lines`.
        text: the document (`str`, or UTF-8 `bytes`).
        format: "text" (paragraphs, lines, bullets and whitespace kept), "html" or "xml" (XHTML too).
        source_lang: the document's language, for the segmenter (``en``, ``eng_Latn``, ``__en__``); None: ``en``.
        max_tokens: the most tokens one sentence may have: longer ones are cut into parts translated in order
            (`cutting`); None: `DEFAULT_MAX_TOKENS`.
        count_tokens: a text's token count (the model's source tokenizer); None: `estimate_tokens`.
        align: for markup, `align(source_words, target_words)`, a word alignment (`alignment`); None:
            proportional.
        target_lang: the translation's language: parts of a cut sentence are joined without a space for
            languages written without spaces.
        attributes: markup attributes whose text is translated.
        max_bytes: the largest document taken.
        progress: called with `(parts done, parts in all)` as the translation goes (`translate_sentences`: then
            `translate_lines` is called once per `chunk_size` parts, shortest first); None: one call.
        chunk_size: parts per call of `translate_lines` with `progress`.
        details: a list that gets one `{"source", "translation", "parts"}` dict per translated sentence (and
            attribute text), in the order they were sent.
        on_sentence: called per sentence translated, as in `translate_sentences` (a markup document's
            attribute texts included).

    Returns:
        The translated document, a `str`; an empty (or whitespace-only) document comes back as it is.

    Raises:
        DocumentError: binary data, invalid UTF-8, a document over `max_bytes`, XML that is not well-formed, an
            unknown format (each named in one line).

    Example:

    >>> upper = lambda lines: [line.upper() for line in lines]
    >>> print(translate_document(upper, "Title\\n\\n- A dog runs. A cat sleeps.\\n  1. Done."))
    TITLE
    <BLANKLINE>
    - A DOG RUNS. A CAT SLEEPS.
      1. DONE.
    >>> reports, sentences = [], []
    >>> _ = translate_document(upper, "One. Two words. Three.", progress=lambda *done: reports.append(done),
    ...                        chunk_size=2, details=sentences)
    >>> reports, [entry["translation"] for entry in sentences]
    ([(0, 3), (2, 3), (3, 3)], ['ONE.', 'TWO WORDS.', 'THREE.'])
    """
    plan = plan_document(text, format, source_lang, max_tokens, count_tokens, target_lang, attributes, max_bytes)
    return translate_plan(translate_lines, plan, align, progress, chunk_size, details, on_sentence)
