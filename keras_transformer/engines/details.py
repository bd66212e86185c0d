"""`Translation`: one translated sentence with its quality signals, the same on every engine.

A translation's log-probability is the sum of its tokens' log-probabilities under the model, every generated
token counted: a target prefix's and a language token's too, and the end token </s> where the search produced it.
Two signals come from it, on every engine alike:

- `mean_log_prob`: that sum divided by the number of those tokens (`tokens`): the model's average confidence per
  token, comparable across sentences of any length and any decoding options (about 0 for a sure sentence; a
  sentence far below its document's others is worth a look);
- `score`: the sum divided by the GNMT length penalty ((5 + tokens) / 6) ** alpha, as `n_best_lines` and
  `score_lines` give it (`alpha` is the translator's `scoring_alpha`: beam search's, 0 otherwise).

An engine reports each translation's text, `score` and `tokens` (what its search returns); the log-probability is
the score times the penalty. Standard library only.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any


def length_penalty(tokens: int, alpha: float) -> float:
    """The GNMT length penalty ((5 + tokens) / 6) ** alpha, as `keras_transformer.decoding.length_penalty`.

    Example:

    >>> length_penalty(7, 1.0), length_penalty(7, 0.0)
    (2.0, 1.0)
    """
    return ((5.0 + tokens) / 6.0) ** float(alpha)


@dataclasses.dataclass(frozen=True)
class Translation:
    """One sentence's translation and its quality signals (the module's docstring).

    Attributes:
        text: the translation.
        score: its log-probability divided by the length penalty of `alpha`, as `n_best_lines` scores.
        log_prob: the sum of its tokens' log-probabilities.
        tokens: the tokens generated, </s> included (0 for a blank line, which reaches no model).

    Example:

    >>> best = Translation.from_score("Ein Hund.", score=-1.0, tokens=7, alpha=1.0)
    >>> best.log_prob, best.mean_log_prob
    (-2.0, -0.2857142857142857)
    >>> best.to_dict()["mean_log_prob"] == best.mean_log_prob
    True
    """

    text: str
    score: float
    log_prob: float
    tokens: int

    @property
    def mean_log_prob(self) -> float:
        """The mean log-probability of a token: `log_prob / tokens` (0 for a blank line)."""
        return self.log_prob / self.tokens if self.tokens else 0.0

    @classmethod
    def from_score(cls, text: str, score: float, tokens: int, alpha: float) -> Translation:
        """The translation of a search's `(text, score, tokens)`, its score normalised with `alpha`."""
        return cls(text, float(score), float(score) * length_penalty(tokens, alpha), int(tokens))

    @classmethod
    def joined(cls, text: str, parts: Sequence[Translation], alpha: float) -> Translation:
        """The translation `text` of a sentence translated in `parts` (a long sentence cut): the parts'
        log-probabilities and tokens summed, the score normalised over all of them.

        Example:

        >>> parts = [Translation("a", -0.5, -1.0, 2), Translation("b", -1.0, -3.0, 3)]
        >>> Translation.joined("a b", parts, alpha=0.0)
        Translation(text='a b', score=-4.0, log_prob=-4.0, tokens=5)
        """
        if len(parts) == 1:
            return dataclasses.replace(parts[0], text=text)
        log_prob, tokens = sum(part.log_prob for part in parts), sum(part.tokens for part in parts)
        return cls(text, log_prob / length_penalty(tokens, alpha) if tokens else 0.0, log_prob, tokens)

    def to_dict(self) -> dict[str, Any]:
        """The translation as JSON-ready values: `text`, `score`, `mean_log_prob`, `log_prob` and `tokens`."""
        return {"text": self.text, "score": self.score, "mean_log_prob": self.mean_log_prob,
                "log_prob": self.log_prob, "tokens": self.tokens}


BLANK = Translation("", 0.0, 0.0, 0)  # what a blank line translates to, without reaching a model


def sentence_record(source: str, translation: Translation) -> dict[str, Any]:
    """A document's sentence as JSON-ready values: its `source`, then `translation` (its text) and the signals.

    Example:

    >>> sentence_record("A dog.", Translation("Ein Hund.", -0.5, -1.0, 4))["mean_log_prob"]
    -0.25
    """
    record = translation.to_dict()
    return {"source": source, "translation": record.pop("text"), **record}


class SentenceDetails:
    """A document's sentence records, gathered as `translate_document(..., details=True)` translates it.

    `translate_lines` goes to `documents.document.translate_document` as its batch translation (texts out, each
    line's `Translation` kept under the line), and `on_sentence` as its hook: each sentence takes its parts'
    translations, joined (`Translation.joined`), into `sentences` as a `sentence_record`. The lines may come in
    any order and in several calls (a document translated with a progress report goes shortest first).

    Example:

    >>> gathered = SentenceDetails(lambda lines: [Translation(t.upper(), -1.0, -2.0, 2) for t in lines], alpha=0.0)
    >>> gathered.translate_lines(["b", "a"])
    ['B', 'A']
    >>> gathered.on_sentence("a b", ["a", "b"], "A B")
    >>> gathered.sentences[0]["translation"], gathered.sentences[0]["mean_log_prob"]
    ('A B', -1.0)
    """

    def __init__(self, translate_detailed: Callable[[list[str]], list[Translation]], alpha: float) -> None:
        self._translate_detailed, self._alpha = translate_detailed, float(alpha)
        self._pending: dict[str, collections.deque[Translation]] = collections.defaultdict(collections.deque)
        self.sentences: list[dict[str, Any]] = []

    def translate_lines(self, lines: list[str]) -> list[str]:
        """The texts of `translate_detailed(lines)`, whose `Translation`s wait for their sentences."""
        translations = self._translate_detailed(lines)
        for line, translation in zip(lines, translations):
            self._pending[line].append(translation)
        return [translation.text for translation in translations]

    def on_sentence(self, source: str, parts: list[str], text: str) -> None:
        """Records `source`, translated as `text` from the translations of its `parts` (lines sent)."""
        taken = [self._pending[part].popleft() for part in parts]
        self.sentences.append(sentence_record(source, Translation.joined(text, taken, self._alpha)))
