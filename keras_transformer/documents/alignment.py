"""Word alignments between a sentence and its translation, for placing inline tags (`documents.markup`).

An aligner is any function `align(source_words, target_words) -> np.ndarray` of shape
`(len(source_words), len(target_words))`: nonnegative weights, larger where a target word translates a source word
(the words are the whitespace-separated words of the sentence and of its translation). Two are here:

- `proportional_alignment`, which needs nothing from the model: target word `j` of `m` aligns to source word
  `floor((j + 0.5) * n / m)` of `n`. Right for short tagged phrases in languages of similar word order, and what
  every engine can do.
- `attention_aligner(attention)`, from the model's cross-attention (`TranslatorInterface.attention`, one
  teacher-forced pass over the pair): `alignment_from_attention` takes the **penultimate decoder layer**'s
  cross-attention **averaged over its heads** (the last layer for a one-layer decoder). Garg et al. (2019, "Jointly
  Learning to Align and Translate with Transformer Models") found, for a standard 6-layer Transformer, the
  penultimate layer's head average gives the best alignments of all layers; single heads are noisier, and the
  average needs no head chosen per model. Each target subword votes for the source subword it attends to most
  (the source's end token and language tokens excluded); a word pair's weight is its votes, attention mass
  breaking ties. (Attention weights are read at the step that predicts the target subword, as `AttentionMaps`
  labels its rows; on the shipped model that reading aligned better than the step after it, which Chen et al.
  2020 found better for some models.)

Standard library and numpy only: the weights come in as arrays, whoever computed them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Aligner = Callable[[Sequence[str], Sequence[str]], np.ndarray]
SPECIAL_PIECES = ("<s>", "</s>", "<pad>")
_WORD_START = "\u2581"  # SentencePiece's "▁": the piece starts a word


def proportional_alignment(source_words: Sequence[str], target_words: Sequence[str]) -> np.ndarray:
    """The alignment by relative position: each target word to the source word at the same relative place.

    Example:

    >>> proportional_alignment(["a", "black", "dog"], ["ein", "schwarzer", "Hund"]).argmax(axis=0)
    array([0, 1, 2])
    >>> proportional_alignment(["dogs"], ["die", "Hunde"]).tolist()
    [[1.0, 1.0]]
    """
    n, m = len(source_words), len(target_words)
    weights = np.zeros((n, m), dtype="float32")
    if n and m:
        weights[np.minimum(((np.arange(m) + 0.5) * n / m).astype(int), n - 1), np.arange(m)] = 1.0
    return weights


def word_ids(pieces: Sequence[str], specials: Sequence[str] = SPECIAL_PIECES) -> list[int]:
    """Per SentencePiece piece, the index of the word it belongs to (a piece starting with "▁" starts a word);
    -1 for special pieces (`specials`: ``</s>``, a language token).

    Example:

    >>> word_ids(["▁A", "▁black", "▁do", "g", ".", "</s>"])
    [0, 1, 2, 2, 2, -1]
    """
    ids, word = [], -1
    for piece in pieces:
        if piece in specials:
            ids.append(-1)
            continue
        if piece.startswith(_WORD_START) or word < 0:
            word += 1
        ids.append(word)
    return ids


def choose_layer(layers: int) -> int:
    """The decoder layer whose cross-attention aligns best: the penultimate one, the last for one layer.

    Example:

    >>> choose_layer(6), choose_layer(1)
    (4, 0)
    """
    return max(layers - 2, 0)


def alignment_from_attention(cross: Sequence[np.ndarray], source_word_ids: Sequence[int],
                             target_word_ids: Sequence[int], layer: int | None = None) -> np.ndarray:
    """Word alignment weights from cross-attention weights: `(source words, target words)`.

    Args:
        cross: per decoder layer, float `(H, T, S)`: row t is the position predicting target piece t.
        source_word_ids: S word indices of the source pieces (`word_ids`; -1 for pieces to leave out).
        target_word_ids: T word indices of the target pieces (-1 for ``</s>``).
        layer: the decoder layer to read; None: `choose_layer` (the penultimate).

    Returns:
        float32 `(max(source_word_ids) + 1, max(target_word_ids) + 1)`: per word pair, how many of the target
        word's pieces attend most to a piece of the source word, plus 1e-3 times the attention between them.

    Example:

    >>> import numpy as np
    >>> heads = np.array([[[0.1, 0.8, 0.1], [0.7, 0.2, 0.1]]] * 2)  # (H=2, T=2, S=3): crossed
    >>> alignment_from_attention([heads, heads], [0, 1, -1], [0, 1]).argmax(axis=0)
    array([1, 0])
    """
    weights = np.asarray(cross[choose_layer(len(cross)) if layer is None else layer], dtype="float64").mean(axis=0)
    source_ids, target_ids = np.asarray(source_word_ids), np.asarray(target_word_ids)
    if weights.shape != (len(target_ids), len(source_ids)):
        raise ValueError(f"alignment_from_attention: weights of shape {weights.shape} for {len(target_ids)} target "
                         f"and {len(source_ids)} source pieces.")
    n, m = int(source_ids.max(initial=-1)) + 1, int(target_ids.max(initial=-1)) + 1
    words = np.zeros((n, m))
    kept = source_ids >= 0
    if not kept.any():
        return words.astype("float32")
    to_source = np.zeros((len(source_ids), n))  # piece -> word, one-hot (S, n)
    to_source[np.flatnonzero(kept), source_ids[kept]] = 1.0
    for t, j in enumerate(target_ids):
        if j < 0:
            continue
        row = np.where(kept, weights[t], -np.inf)
        words[source_ids[int(np.argmax(row))], j] += 1.0
        words[:, j] += 1e-3 * (weights[t] * kept) @ to_source
    return words.astype("float32")


def attention_aligner(attention: Callable[[str, str], Any], specials: Sequence[str] = SPECIAL_PIECES) -> Aligner:
    """An aligner from a translator's `attention(sentence, translation)` (an `attention.maps.AttentionMaps`, or
    any object with `cross`, `source_tokens` and `target_outputs`), by `alignment_from_attention`.

    It falls back to `proportional_alignment` for the pair, and from then on, where the engine gives no attention
    (`NotImplementedError`; a `ValueError` from an ensemble, whose members attend differently); and for a pair
    whose pieces do not spell the words given (a tokenizer that normalises the text), as it does for a pair
    without words.

    Example:

    >>> def no_attention(sentence, translation):
    ...     raise NotImplementedError
    >>> attention_aligner(no_attention)(["a", "dog"], ["ein", "Hund"]).argmax(axis=0)
    array([0, 1])
    """
    state = {"available": True}

    def align(source_words: Sequence[str], target_words: Sequence[str]) -> np.ndarray:
        if not (state["available"] and len(source_words) and len(target_words)):
            return proportional_alignment(source_words, target_words)
        try:
            maps = attention(" ".join(source_words), " ".join(target_words))
        except (NotImplementedError, ValueError):  # no maps from this engine, or for an ensemble
            state["available"] = False
            return proportional_alignment(source_words, target_words)
        source_ids = word_ids(maps.source_tokens, specials)
        target_ids = word_ids(maps.target_outputs, specials)
        if max(source_ids, default=-1) + 1 != len(source_words) or max(target_ids, default=-1) + 1 != len(target_words):
            return proportional_alignment(source_words, target_words)
        return alignment_from_attention(maps.cross, source_ids, target_ids)

    return align
