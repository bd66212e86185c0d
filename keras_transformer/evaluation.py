"""BLEU and chrF on detokenized text, the published Multi30k BLEU protocol, and reading the text files scored.

`chrf(hypotheses, references)` is sacreBLEU's chrF (character n-grams), reported beside BLEU. Two ways to report
BLEU, both with sacreBLEU:

- `bleu(hypotheses, references)`: sacreBLEU's own 13a tokenization on
  detokenized text, cased (the default) or `lowercase=True`. This is the
  comparable, reproducible figure (with `signature`).
- `multi30k_bleu(hypotheses, references, lang)`: the protocol of the published
  Multi30k results. Hypotheses are lowercased, Moses-punctuation-normalized and
  Moses-tokenized with escaping (`&apos;`, `&quot;`, ... via sacremoses), then
  scored against the distributed `*.lc.norm.tok.*` references with
  `tokenize="none"`. Applied to the raw English validation references, the
  preprocessing reproduces `val.lc.norm.tok.en` line for line.

Checkpoint averaging (the paper averages the last 5 checkpoints for base
models, the last 20 for big ones) is `keras_transformer.workdir.checkpoints`'s
(`average_workdir`, `average_checkpoints`, `latest_checkpoints`).
"""

import logging
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import sacrebleu

from keras_transformer.data import textfile

log = logging.getLogger("keras_transformer")

# The characters `str.splitlines` breaks at (a test derives the same set from it).
_LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]+")


# --------------------------------------------------------------------- BLEU


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """Reads a UTF-8 text file (plain or gzip) into a list of lines without their line ends.

    Lines are what the training data's reader takes them to be
    (`keras_transformer.data.textfile`): split on ``\\n`` only, gzip detected
    from the content; invalid UTF-8 raises `InvalidUTF8Error` (a `ValueError`)
    naming the file, the line and the byte.

    Example:

    >>> read_lines("../shared/data/multi30k/val.en.gz")[0]  # doctest: +SKIP
    'A group of men are loading cotton onto a truck'
    """
    return textfile.read_file(path)[0]


def one_line(text: str) -> str:
    """`text` with each run of line-break characters (those `str.splitlines` breaks at) made one space.

    The line-oriented outputs (the `translate` command, `--output` files of
    `evaluate`) pass each translation through it, and the scores are computed
    on what they write: one line per source sentence, even when a model emits
    a line break (byte-fallback pieces, an under-trained model). The Python
    API (`Translator`, `inference.translate`) returns the text unchanged.

    Example:

    >>> one_line("Ein Mann\\nfährt\\x0bRad.")
    'Ein Mann fährt Rad.'
    """
    return _LINE_BREAKS.sub(" ", text)


def _reference_sets(hypotheses: Sequence[str], references: Sequence[Any], metric: str) -> list[list[str]]:
    """`references` (one set of `str`, or a list of such sets) as a list of sets, each checked to hold one
    reference per hypothesis (a `ValueError` naming `metric` otherwise)."""
    sets = [references] if references and isinstance(references[0], str) else references
    for reference_set in sets:
        if len(hypotheses) != len(reference_set):
            raise ValueError(f"{metric} needs one hypothesis per reference: got {len(hypotheses)} hypotheses "
                             f"and {len(reference_set)} references.")
    return [list(reference_set) for reference_set in sets]


def bleu(hypotheses: Sequence[str], references: Sequence[Any], lowercase: bool = False, tokenize: str = "13a") -> Any:
    """Corpus BLEU with sacreBLEU on detokenized text.

    Args:
        hypotheses: list of `str`, one translation per line.
        references: list of `str` (one reference set) or a list of such lists.
        lowercase: case-insensitive BLEU (sacreBLEU's `--lowercase`).
        tokenize: sacreBLEU tokenizer ("13a", its default; "none" for
            pre-tokenized text).

    Returns:
        A `sacrebleu.BLEUScore`: `.score` is the BLEU value in [0, 100]; the
        metric's signature is `sacrebleu.BLEU(lowercase=..., tokenize=...).get_signature()`.

    Example:

    >>> round(bleu(["A man rides a bike."], ["A man rides a bike."]).score, 2)
    100.0
    """
    reference_sets = _reference_sets(hypotheses, references, "BLEU")
    # force: with tokenize="none" the text is tokenized on purpose (the Multi30k protocol), and sacreBLEU's warning
    # about lines that end in " ." ("you forgot to detokenize") would be wrong.
    metric = sacrebleu.BLEU(lowercase=lowercase, tokenize=tokenize, force=tokenize == "none")
    score = metric.corpus_score(list(hypotheses), reference_sets)
    score.signature = str(metric.get_signature())  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3"
    return score


def chrf(hypotheses: Sequence[str], references: Sequence[Any]) -> Any:
    """Corpus chrF with sacreBLEU (Popović, 2015: character 6-gram F-score, beta 2; sacreBLEU's defaults).

    Scored on characters, chrF credits a word translated with the wrong ending, which BLEU's word n-grams do not:
    it agrees better with human judgement for morphologically rich targets (German), and it is what WMT's metric
    task reports beside BLEU.

    Args:
        hypotheses: list of `str`, one translation per line.
        references: list of `str` (one reference set) or a list of such lists.

    Returns:
        A `sacrebleu.CHRFScore`: `.score` in [0, 100]; `.signature` its sacreBLEU signature
        (e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3").

    Example:

    >>> round(chrf(["A man rides a bike."], ["A man rides a bike."]).score, 2)
    100.0
    """
    reference_sets = _reference_sets(hypotheses, references, "chrF")
    metric = sacrebleu.CHRF()
    score = metric.corpus_score(list(hypotheses), reference_sets)
    score.signature = str(metric.get_signature())
    return score


def moses_preprocess(lines: Iterable[str], lang: str, lowercase: bool = True) -> list[str]:
    """The Multi30k preprocessing: lowercase, Moses punctuation normalization, Moses tokenization.

    Tokenization escapes special characters as the Moses `tokenizer.perl`
    does (`'` -> `&apos;`, `"` -> `&quot;`), as in the `*.lc.norm.tok.*` files.

    Args:
        lines: list of `str`.
        lang: language code ("en", "de", "fr").
        lowercase: lowercase first, as the references were made (`lowercase.perl | normalize-punctuation.perl
            | tokenizer.perl`, multi30k/dataset `scripts/task1-tokenize.sh`). The order matters: Moses'
            nonbreaking prefixes are case-sensitive (German "Bart." stays whole cased, "bart ." lowercased), and
            a period before a lowercase word stays attached ("runs. a cat" in a two-sentence line).

    Returns:
        List of `str`, tokens separated by single spaces.

    Example:

    >>> moses_preprocess(["A boy's red hat."], "en")
    ['a boy &apos;s red hat .']
    """
    from sacremoses import MosesPunctNormalizer, MosesTokenizer  # only the Multi30k protocol needs it

    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    processed = []
    for line in lines:
        line = line.lower() if lowercase else line
        processed.append(tokenizer.tokenize(normalizer.normalize(line), escape=True, return_str=True))
    return processed


def multi30k_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> Any:
    """BLEU by the published Multi30k protocol.

    Args:
        hypotheses: detokenized translations (list of `str`).
        references: the `*.lc.norm.tok.{lang}` lines (already lowercased,
            normalized and tokenized), e.g. `read_lines(".../test_2016_flickr.lc.norm.tok.de.gz")`.
        lang: the target language code, for the Moses rules.

    Returns:
        A `sacrebleu.BLEUScore` computed with `tokenize="none"` on the lowercased,
        Moses-tokenized hypotheses; its `signature` says so (`case:lc`,
        `tok:moses-{lang}`) where sacreBLEU's own would say `case:mixed|tok:none`.

    Example:

    >>> score = multi30k_bleu(["A boy's hat."], ["a boy &apos;s hat ."], "en")
    >>> round(score.score, 2), score.signature.split("|")[1:4]
    (100.0, ['case:lc', 'eff:no', 'tok:moses-en'])
    """
    score = bleu(moses_preprocess(hypotheses, lang), references, tokenize="none")
    score.signature = score.signature.replace("case:mixed", "case:lc").replace("tok:none", f"tok:moses-{lang}")
    return score


def evaluate_translations(hypotheses: Sequence[str], references: Sequence[str], lang: str | None = None,
                          tokenized_references: Sequence[str] | None = None) -> dict[str, float]:
    """All the BLEU and chrF figures we report, as a dict of floats (`scored_translations` adds their signatures).

    Args:
        hypotheses: detokenized translations.
        references: raw (detokenized, cased) references.
        lang: target language code (needed with `tokenized_references`).
        tokenized_references: optional `*.lc.norm.tok.*` lines for the
            Multi30k protocol.

    Returns:
        `{"bleu": cased sacreBLEU, "bleu_lowercase": ..., "chrf": sacreBLEU's chrF, "length_ratio": ...,
        "bleu_multi30k": ...}` (the last only with `tokenized_references`).
        `length_ratio` is the hypotheses' length over the references' in
        sacreBLEU's tokens; below 1 BLEU's brevity penalty applies, which is
        what tuning the length-penalty `alpha` on a validation set is about.

    Example:

    >>> scores = evaluate_translations(["A dog runs ."], ["A dog runs fast ."])
    >>> sorted(scores), round(scores["length_ratio"], 2)
    (['bleu', 'bleu_lowercase', 'chrf', 'length_ratio'], 0.8)
    """
    return scored_translations(hypotheses, references, lang, tokenized_references)[0]


def scored_translations(hypotheses: Sequence[str], references: Sequence[str], lang: str | None = None,
                        tokenized_references: Sequence[str] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """`(scores, signatures)`: `evaluate_translations`' dict, and the sacreBLEU signature of each BLEU and chrF in
    it.

    Example:

    >>> scores, signatures = scored_translations(["A dog runs ."], ["A dog runs fast ."])
    >>> signatures["bleu_lowercase"].startswith("nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:")
    True
    """
    cased = bleu(hypotheses, references)
    lowercased = bleu(hypotheses, references, lowercase=True)
    characters = chrf(hypotheses, references)
    result = {"bleu": cased.score, "bleu_lowercase": lowercased.score, "chrf": characters.score,
              "length_ratio": cased.sys_len / cased.ref_len if cased.ref_len else 0.0}
    signatures = {"bleu": cased.signature, "bleu_lowercase": lowercased.signature, "chrf": characters.signature}
    if tokenized_references is not None:
        if lang is None:
            raise ValueError("evaluate_translations: the Multi30k protocol needs the target language (lang=).")
        multi30k = multi30k_bleu(hypotheses, tokenized_references, lang)
        result["bleu_multi30k"] = multi30k.score
        signatures["bleu_multi30k"] = multi30k.signature
    return result, signatures
