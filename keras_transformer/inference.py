"""Using trained models: load a translator from any workdir, export or ensemble; translate and evaluate.

The user-facing functions behind `keras-transformer translate` and `evaluate` (`average` is
`workdir.average_workdir`).

Each takes a model folder (or a list of them, an ensemble) and loads it with
`keras_transformer.load_translator` (`engines.loader`), or a translator already loaded.
The folders' layout is `keras_transformer.workdir.checkpoints`'s.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from keras_transformer import evaluation
from keras_transformer.data import textfile
from keras_transformer.documents import document
from keras_transformer.engines.ctranslate2 import is_ctranslate2_model
from keras_transformer.engines.litert import is_litert_model
from keras_transformer.engines.loader import load_translator
from keras_transformer.errors import ConfigError, DocumentError, format_size
from keras_transformer.files import atomic_write_text, check_not_an_input, check_output_file
from keras_transformer.workdir.checkpoints import model_folder

log = logging.getLogger("keras_transformer")


def _lines(source: str | os.PathLike[str] | Iterable[str]) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        return evaluation.read_lines(source)  # names a missing file, or a folder given for one
    return list(source)


def _in(source: Any) -> str:
    """` in FILE` for a file argument; nothing for a list of sentences."""
    return f" in {os.fspath(source)}" if isinstance(source, (str, os.PathLike)) else ""


def translate(model: Any, sentences: Iterable[str], checkpoint: Any = None, average: int | None = None,
              batch_size: int = 64, target_prefix: str | list[str] | None = None, target_lang: str | None = None,
              **options: Any) -> list[str]:
    """Translates sentences with a trained workdir or an exported model (`keras-transformer translate`).

    Args:
        model: a training workdir, an export directory, a list of them (an
            ensemble; see `load_translator`), or a `Translator`.
        sentences: a list of `str` (one sentence: a list of one).
        checkpoint, average, **options: see `load_translator`.
        batch_size: sentences decoded together.
        target_prefix, target_lang: the translations' forced start
            (`TranslatorInterface.translate_lines`).

    Returns:
        A list of `str`, one translation per sentence.

    Raises:
        TypeError: `sentences` is one `str` or `bytes` (neither a file name nor
            taken character by character).

    Example:

    >>> translate("saved_models/multi30k_en_de", ["A man rides a bike."])  # doctest: +SKIP
    ['Ein Mann fährt Fahrrad.']
    """
    if isinstance(sentences, (str, bytes)):
        raise TypeError(f"translate takes a list of sentences, got one {type(sentences).__name__}: "
                        f"{sentences[:40]!r}; give one sentence as [sentence], and a file's lines as "
                        "keras_transformer.evaluation.read_lines(path).")
    translator = model if hasattr(model, "translate_lines") else load_translator(model, checkpoint, average, **options)
    return translator.translate_lines(list(sentences), batch_size=batch_size, target_prefix=target_prefix,
                                      target_lang=target_lang)


def read_document_file(path: str | os.PathLike[str] | None,
                       max_bytes: int = document.MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of a document file (gzip decompressed), or of stdin with `path` None, up to `max_bytes`.

    Raises:
        DocumentError: more than `max_bytes` (the file's size and the limit named).
        FileNotFoundError, IsADirectoryError: naming `path`.

    Example:

    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = path.write_bytes(b"A dog.")
    >>> read_document_file(path)
    b'A dog.'
    >>> read_document_file(path, max_bytes=4)
    Traceback (most recent call last):
    ...
    keras_transformer.errors.DocumentError: ...a.txt (6 bytes) is over the limit of 4 bytes for one document ...
    """
    if path is None:
        stream = textfile.open_stream(sys.stdin.buffer)
        name = "stdin"
    else:
        stream = textfile.open_binary(path)
        name = os.fspath(path)
    with stream:
        data = stream.read(max_bytes + 1)
    if len(data) > max_bytes:
        size = os.path.getsize(path) if path is not None else 0
        size_text = f" ({format_size(size)})" if size > max_bytes else ""  # a gzip file's own size may be less
        raise DocumentError(f"{name}{size_text} is over the limit of {format_size(max_bytes)} for one document "
                            f"(max_bytes={max_bytes}); split it into smaller documents.")
    return data


def translate_file(model: Any, input: str | os.PathLike[str] | None, output: str | os.PathLike[str] | None = None,
                   format: str = "text", source_lang: str | None = None, target_lang: str | None = None,
                   batch_size: int = 64, progress: document.Progress | None = None,
                   details: list[dict[str, Any]] | None = None, max_bytes: int = document.MAX_DOCUMENT_BYTES,
                   glossary: Any = None, banned: Any = None, constraints: Sequence[Any] | None = None,
                   **options: Any) -> str:
    """Translates a file (`keras-transformer translate --input FILE --output FILE`) as a document, or line by line.

    Args:
        model: a model folder, a list of them (an ensemble), or a translator (`load_translator`).
        input: the file (plain or gzip); None: stdin.
        output: where the translation is written: under a temporary name in its folder, renamed when complete,
            so it appears only whole (and an earlier file stays as it was when the translation fails); None: not
            written.
        format: "text", "html" or "xml": the file as one document (`TranslatorInterface.translate_document`:
            segmented, its layout or markup kept); "lines": one sentence per line, one translation per line.
        source_lang: the document's language (the segmenter's rules; a multilingual model's source token); None:
            the model's.
        target_lang: a multilingual model's target language.
        batch_size: sentences decoded together.
        progress: `progress(sentences done, sentences in all)` after each batch.
        details: a list that gets one record per sentence (documents only): `source`, `translation` and its
            quality signals (`TranslatorInterface.translate_document`'s `details`).
        max_bytes: the largest document taken.
        glossary: a `decoding.Glossary` or a TSV glossary's path: each sentence must contain the target terms of
            the entries found in it (`TranslatorInterface.translate_terms`).
        banned: target texts no translation may contain.
        constraints: target terms every line must contain ("lines" only: a document's sentences each need their
            own; give a glossary).
        **options: `load_translator`'s, where `model` is a folder.

    Returns:
        The translation, a `str`; an empty document gives an empty translation (and an empty `output` file).

    Raises:
        DocumentError: a binary file, invalid UTF-8 (its byte offset named), XML that is not well-formed, a file
            over `max_bytes` (the limit named).
        ConfigError: constraints on a document; terms on an engine that cannot force them (named).

    Example:

    >>> translate_file("saved_models/multi30k_en_de", "doc.txt", "doc.de.txt")  # doctest: +SKIP
    'Ein Hund rennt. Eine Katze schläft.\\n'
    """
    if format not in (*document.FORMATS, "lines"):
        raise DocumentError(f"unknown format {format!r}; choose one of {', '.join((*document.FORMATS, 'lines'))}.")
    if constraints and format != "lines":
        raise ConfigError(f"constraints are for lines (format lines), not for a {format} document: each sentence "
                          "needs its own; give a glossary (its entries found in a sentence become its constraints).")
    data = read_document_file(input, max_bytes)
    translator = model if hasattr(model, "translate_lines") else load_translator(model, **options)
    if format == "lines":
        text = document.read_document(data, max_bytes)
        lines = text.splitlines()
        sources = translator.with_source_lang(lines, source_lang, "translate") if source_lang else lines
        terms = {} if not (constraints or glossary is not None or banned) else {
            "constraints": [list(constraints or ())] * len(sources), "banned": banned or None, "glossary": glossary}
        translations = translator.translate_lines(sources, batch_size=batch_size, target_lang=target_lang, **terms)
        translated = "".join(evaluation.one_line(line) + "\n" for line in translations)
    else:
        result = translator.translate_document(data, format, source_lang=source_lang, target_lang=target_lang,
                                               batch_size=batch_size, max_bytes=max_bytes, progress=progress,
                                               details=details is not None, glossary=glossary,
                                               banned=banned or None)
        if isinstance(result, dict):
            translated = result["text"]
            if details is not None:
                details.extend(result["sentences"])
        else:
            translated = result
    if output is not None:
        atomic_write_text(output, translated)
    return translated


def evaluate(model: Any, source: str | os.PathLike[str] | Iterable[str],
             reference: str | os.PathLike[str] | Iterable[str],
             tokenized_reference: str | os.PathLike[str] | Iterable[str] | None = None, lang: str | None = None,
             checkpoint: Any = None, average: int | None = None, batch_size: int = 64,
             output: str | os.PathLike[str] | None = None, details: bool = False, target_lang: str | None = None,
             **options: Any) -> Any:
    """Translates `source` and scores it with sacreBLEU (`keras-transformer evaluate`).

    Args:
        model: a training workdir, an export directory, a list of them (an
            ensemble; see `load_translator`), or a `Translator`.
        source: the source file (plain or .gz) or a list of sentences.
        reference: the reference file or list, raw text (cased sacreBLEU).
        tokenized_reference: optional `*.lc.norm.tok.*` references: adds the
            published Multi30k BLEU (needs `lang`).
        lang: the target language code, for the Multi30k protocol.
        checkpoint, average, **options: see `load_translator`.
        batch_size: sentences decoded together.
        output: if given, the translations are written there, one per line
            (line breaks inside a translation become spaces: `evaluation.one_line`); its folder
            must exist.
        details: also return what it takes to reproduce the scores (see Returns).
        target_lang: a multilingual model's target language, whose token each translation starts with
            (`TranslatorInterface.translate_lines`).

    Raises:
        ValueError / OSError: before any decoding: unreadable or misaligned files (the
        references, tokenized ones included, must have one line per source sentence), or an
        `output` that cannot be written.

    Returns:
        `{"bleu": ..., "bleu_lowercase": ..., "chrf": ..., "length_ratio": ...}` plus `"bleu_multi30k"` with
        tokenized references (`evaluation.evaluate_translations`), rounded to 2 decimals (ratio: 4).
        With `details`, `(scores, details)`: `details` holds `signatures` (sacreBLEU's, per score),
        `models` (each model folder and the weights files it decoded with: `describe_weights`),
        `decoding` (the translator's `DecodeOptions`, as a dict),
        `sentences` and `seconds` (loading and decoding).

    Example:

    >>> evaluate("runs/en_de", "test.en", "test.de")  # doctest: +SKIP
    {'bleu': 38.1, 'bleu_lowercase': 39.5, 'chrf': 63.2, 'length_ratio': 0.9712}
    """
    # Everything that can be checked is checked before decoding, which takes minutes on a whole test set.
    if output is not None:
        check_output_file(output)
        check_not_an_input(output, [source, reference, tokenized_reference])
    sources, references = _lines(source), _lines(reference)
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} source sentences{_in(source)} but {len(references)} references"
                         f"{_in(reference)}: they must pair line by line.")
    tokenized = _lines(tokenized_reference) if tokenized_reference is not None else None
    if tokenized is not None and lang is None:
        raise ConfigError("The Multi30k BLEU protocol (tokenized references) needs the target language (lang).")
    if tokenized is not None and len(tokenized) != len(sources):
        raise ValueError(f"{len(sources)} source sentences{_in(source)} but {len(tokenized)} tokenized references"
                         f"{_in(tokenized_reference)}: they must pair line by line.")
    started = time.perf_counter()
    translator = model if hasattr(model, "translate_lines") else load_translator(model, checkpoint, average, **options)
    hypotheses = [evaluation.one_line(h) for h in translate(translator, sources, batch_size=batch_size,
                                                            target_lang=target_lang)]
    seconds = time.perf_counter() - started
    if output is not None:
        atomic_write_text(output, "".join(line + "\n" for line in hypotheses))
    scores, signatures = evaluation.scored_translations(hypotheses, references, lang=lang,
                                                        tokenized_references=tokenized)
    scores = {key: round(float(value), 4 if key == "length_ratio" else 2) for key, value in scores.items()}
    if not details:
        return scores
    decoding = translator.options.to_dict() if getattr(translator, "options", None) is not None else {}
    return scores, {"signatures": signatures, "models": describe_weights(model, checkpoint, average),
                    "decoding": decoding, "sentences": len(sources), "seconds": round(seconds, 2)}


def describe_weights(model: Any, checkpoint: Any = None, average: int | None = None) -> list[dict[str, Any]]:
    """Which weights `load_translator(model, checkpoint, average)` decodes with: a list of
    `{"model": folder, "weights": [files]}`, one per model folder (several files are averaged); an in-memory
    translator gives `[]`, a CTranslate2 export its `model.bin`, a LiteRT export its `model.tflite`.

    Example:

    >>> describe_weights("saved_models/multi30k_en_de")  # doctest: +SKIP
    [{'model': 'saved_models/multi30k_en_de', 'weights': ['saved_models/multi30k_en_de/assets.extra/model.weights.h5']}]
    """
    if hasattr(model, "translate_lines"):
        return []
    paths = list(model) if isinstance(model, (list, tuple)) else [model]
    checkpoints = list(checkpoint) if isinstance(checkpoint, (list, tuple)) else [checkpoint] * len(paths)
    described = []
    for path, chosen in zip(paths, checkpoints):
        if is_ctranslate2_model(path):
            described.append({"model": os.fspath(path), "weights": [os.path.join(os.fspath(path), "model.bin")]})
            continue
        if is_litert_model(path):
            described.append({"model": os.fspath(path), "weights": [os.path.join(os.fspath(path), "model.tflite")]})
            continue
        folder = model_folder(path, chosen, average)
        described.append({"model": os.fspath(path),
                          "weights": [os.fspath(w) for member in folder.members for w in member.weights]})
    return described
