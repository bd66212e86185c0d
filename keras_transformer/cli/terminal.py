"""What the command reads and prints beyond its flags: stdin in chunks of lines, `evaluate`'s readable report,
the progress bar of a translated document, and `translate`'s lines for sentences held to terms."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from keras_transformer.data import textfile
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.engines.details import Translation
from keras_transformer.errors import ConfigError


def evaluation_report(scores: dict[str, Any], details: dict[str, Any]) -> str:
    """The readable report of `evaluate`: each score (BLEU, chrF) with its sacreBLEU signature, the weights, the
    decoding.

    Example:

    >>> print(evaluation_report({"bleu": 38.1, "chrf": 63.24, "length_ratio": 0.97}, {
    ...     "signatures": {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3",
    ...                    "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3"},
    ...     "models": [{"model": "runs/a", "weights": ["runs/a/checkpoints/ckpt-0009.weights.h5",
    ...                                                "runs/a/checkpoints/ckpt-0010.weights.h5"]}],
    ...     "decoding": {"beam_size": 4, "alpha": 0.6}, "sentences": 1000, "seconds": 12.34}))
    bleu            38.10  nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.3
    chrf            63.24  nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.3
    length_ratio    0.9700
    model           runs/a: average of ckpt-0009.weights.h5, ckpt-0010.weights.h5
    decoding        beam: beam_size 4, alpha 0.6, max_extra 50
    sentences       1000 in 12.3 s
    """
    lines = []
    for key, value in scores.items():
        figure = f"{value:.4f}" if key == "length_ratio" else f"{value:.2f}"
        signature = details.get("signatures", {}).get(key)
        lines.append(f"{key:<15} {figure}" + (f"  {signature}" if signature else ""))
    for entry in details.get("models", []):
        weights = entry["weights"]
        named = (os.fspath(weights[0]) if len(weights) == 1 else
                 "average of " + ", ".join(os.path.basename(os.fspath(w)) for w in weights))
        lines.append(f"{'model':<15} {entry['model']}: {named}")
    decoding = details.get("decoding") or {}
    try:  # the translator's DecodeOptions: the settings its strategy uses
        decoding = DecodeOptions.from_dict(decoding).describe() if decoding else ""
    except (ConfigError, TypeError):
        decoding = ", ".join(f"{key} {value}" for key, value in decoding.items())
    if decoding:
        lines.append(f"{'decoding':<15} {decoding}")
    lines.append(f"{'sentences':<15} {details.get('sentences')} in {details.get('seconds', 0):.1f} s")
    return "\n".join(lines)


def unmet_note(number: int, unmet: list[Any]) -> str:
    """The stderr line naming the constraints sentence `number` (from 1) lacks (each a text, or a list of
    alternative forms: `engines.terms.shown`).

    Example:

    >>> print(unmet_note(3, ["Vertrag", ["Fahrrad", "Rad"]]))
    Line 3: constraints not met: 'Vertrag', 'Fahrrad' or 'Rad'
    """
    named = [repr(term) if isinstance(term, str) else " or ".join(map(repr, term)) for term in unmet]
    return f"Line {number}: constraints not met: {', '.join(named)}"


def term_output(found: list[list[dict[str, Any]]], first: int, n_best: int | None, as_json: bool,
                one_line: Callable[[str], str], alpha: float = 0.0) -> tuple[list[str], list[str]]:
    """`(stdout lines, stderr lines)` of `translate` for `translate_terms` results of the sentences numbered from
    `first` (from 1): each best translation on one line (`n_best`: N `INDEX<TAB>SCORE<TAB>MEAN_LOG_PROB<TAB>
    TRANSLATION` lines, INDEX from 0, as without terms; `as_json`: one object per sentence, `line`, `translation`,
    `score`, `mean_log_prob` and `unmet`), and an `unmet_note` for each sentence whose best translation lacks a
    constraint. The mean log-probability is the score's (`engines.details`: `tokens` generated, the scores
    normalised with `alpha`). `one_line` makes a translation one line (`evaluation.one_line`).

    Example:

    >>> out, err = term_output([[{"translation": "Der Vertrag.", "score": -0.4, "tokens": 4, "unmet": []}],
    ...                         [{"translation": "Ein Rad.", "score": -0.9, "tokens": 3, "unmet": ["Velo"]}]], 1,
    ...                        None, True, str)
    >>> print("\\n".join(out + err))
    {"line": 1, "translation": "Der Vertrag.", "score": -0.4, "mean_log_prob": -0.1, "unmet": []}
    {"line": 2, "translation": "Ein Rad.", "score": -0.9, "mean_log_prob": -0.3, "unmet": ["Velo"]}
    Line 2: constraints not met: 'Velo'
    """
    out, err = [], []
    for number, hypotheses in enumerate(found, first):
        best = hypotheses[0]
        if best["unmet"]:
            err.append(unmet_note(number, best["unmet"]))
        signals = [Translation.from_score(h["translation"], h["score"], h["tokens"], alpha) for h in hypotheses]
        if as_json:
            out.append(json.dumps({"line": number, "translation": best["translation"], "score": best["score"],
                                   "mean_log_prob": round(signals[0].mean_log_prob, 6), "unmet": best["unmet"]},
                                  ensure_ascii=False))
        elif n_best is None:
            out.append(one_line(best["translation"]))
        else:
            out.extend(f"{number - 1}\t{h.score:.4f}\t{h.mean_log_prob:.4f}\t{one_line(h.text)}"
                       for h in signals[:n_best])
    return out, err


STDIN_CHUNK_BATCHES = 32  # translate reads stdin this many batches at a time and prints each chunk's lines


def stdin_chunks(size: int) -> Iterator[list[str]]:
    """stdin's lines in lists of `size`, split as files are (`data.textfile`: gzip is decompressed as it comes);
    bytes that are not UTF-8 become U+FFFD, whatever error handler the locale gives `sys.stdin`."""
    if hasattr(sys.stdin, "buffer"):
        stream = sys.stdin.buffer
        stream = textfile.open_stream(stream) if hasattr(stream, "read") else stream
        lines = (line for line, _ in textfile.iter_stream(stream, "stdin", errors="replace"))
    else:  # a text stream put in its place (embedding)
        lines = (line.rstrip("\n") for line in sys.stdin)
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class ProgressBar:
    """A progress bar on one line of `stream`: sentences done of all, and sentences per second, rewritten in place
    after each batch (`translate_document`'s `progress`); a line break when all are done.

    Example:

    >>> import io
    >>> stream, times = io.StringIO(), iter([0.0, 2.0, 4.0])
    >>> bar = ProgressBar(stream, clock=lambda: next(times), width=10)
    >>> bar(0, 80); bar(40, 80); bar(80, 80)
    >>> print(stream.getvalue().split("\\r")[-1], end="")
    [##########] 80/80 sentences, 20.0 sentences/s
    """

    def __init__(self, stream: Any, clock: Callable[[], float] = time.monotonic, width: int = 30) -> None:
        self.stream, self.clock, self.width = stream, clock, width
        self.start: float | None = None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if self.start is None:
            self.start = now
        elapsed = now - self.start
        rate = f"{done / elapsed:.1f}" if elapsed > 0 else "-"
        filled = self.width * done // max(total, 1)
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} sentences, "
                          f"{rate} sentences/s" + ("\n" if done >= total else ""))
        self.stream.flush()


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal (a progress bar shows on its own only there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
