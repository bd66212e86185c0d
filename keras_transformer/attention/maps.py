"""Attention maps of one sentence pair: every attention weight matrix of a model, with the tokens for the axes.

`AttentionMaps` is what a translator's `attention(sentence)` returns
(`keras_transformer.engines.interface.TranslatorInterface`) and what
`keras_transformer.attention.plotting` draws. The numbers come from one teacher-forced
pass over the source and ``<s> + translation`` (`attention_weights`); each
engine brings its own tokenizer for the axes' tokens (`attention_maps`).

Axes: a row is a query position, a column a key position, and each row sums to
one. Source axes show the source subwords followed by ``</s>``. Decoder rows
are labelled with the token that position *predicts* (the translation's
subwords, then ``</s>``), so a cross-attention map reads as an alignment.
Decoder self-attention columns are the decoder *inputs* (``<s>`` and the
translation shifted right).

Keras and numpy only: the TensorFlow translator and the TensorFlow-free packed
one build their maps here.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from keras_transformer.model import decode, encode

KINDS = ("encoder_self", "decoder_self", "cross")


@dataclasses.dataclass
class AttentionMaps:
    """The attention weights of one sentence pair, with the tokens for the axes.

    Attributes:
        source_tokens: S subword strings, the source then ``"</s>"``.
        target_inputs: T strings, the decoder inputs: ``"<s>"`` then the translation's subwords.
        target_outputs: T strings, what each decoder position predicts: the subwords then ``"</s>"``.
        translation: the detokenized translation (or the given target).
        encoder_self: per encoder layer, float32 ``(H, S, S)``.
        decoder_self: per decoder layer, float32 ``(H, T, T)``.
        cross: per decoder layer, float32 ``(H, T, S)``.
    """

    source_tokens: list[str]
    target_inputs: list[str]
    target_outputs: list[str]
    translation: str
    encoder_self: list[np.ndarray]
    decoder_self: list[np.ndarray]
    cross: list[np.ndarray]

    def axes(self, kind: str) -> tuple[list[np.ndarray], list[str], list[str]]:
        """`(weights per layer, row tokens, column tokens)` of one kind of attention.

        Example:

        >>> weights, rows, columns = maps.axes("cross")  # doctest: +SKIP
        >>> weights[0].shape == (len(weights[0]), len(rows), len(columns))  # doctest: +SKIP
        True
        """
        if kind == "encoder_self":
            return self.encoder_self, self.source_tokens, self.source_tokens
        if kind == "decoder_self":
            return self.decoder_self, self.target_outputs, self.target_inputs
        if kind == "cross":
            return self.cross, self.target_outputs, self.source_tokens
        raise ValueError(f"Unknown attention kind {kind!r}; choose one of {KINDS}.")


def attention_weights(model: Any, source_ids: Any, target_ids: Any, pad_id: int = 0) -> dict[str, list[np.ndarray]]:
    """Every attention weight matrix of one teacher-forced pass (dropout off).

    Args:
        model: a `keras_transformer.build_model` model.
        source_ids: int ``(S,)`` source ids (tokens then eos), no padding.
        target_ids: int ``(T,)`` decoder inputs (bos then tokens), no padding.
        pad_id: the padding id.

    Returns:
        ``{"encoder_self": [(H, S, S)] * N_enc, "decoder_self": [(H, T, T)] * N_dec,
        "cross": [(H, T, S)] * N_dec}`` as float32 numpy arrays; every row sums to 1.

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> weights = attention_weights(model, np.array([5, 6, 3]), np.array([2, 9]))
    >>> [w.shape for w in weights["cross"]]
    [(4, 2, 3), (4, 2, 3)]
    """

    source = np.asarray(source_ids, dtype="int32").reshape(1, -1)  # (1, S)
    target = np.asarray(target_ids, dtype="int32").reshape(1, -1)  # (1, T)
    memory, source_padding, encoder_scores = encode(model, source, pad_id=pad_id, return_attention_scores=True)
    _, decoder_scores = decode(model, target, memory, source_padding, return_attention_scores=True)

    def first(weights: Any) -> np.ndarray:  # (1, H, Q, K) -> float32 (H, Q, K)
        return np.asarray(weights, dtype="float32")[0]

    return {"encoder_self": [first(w) for w in encoder_scores],
            "decoder_self": [first(layer["self"]) for layer in decoder_scores],
            "cross": [first(layer["cross"]) for layer in decoder_scores]}


def strip_special(ids: Any, eos_id: int, pad_id: int, bos_id: int) -> list[int]:
    """Ids up to (not including) the first eos, without pad/bos."""
    out = []
    for token in np.asarray(ids).reshape(-1).tolist():
        if token == eos_id:
            break
        if token not in (pad_id, bos_id):
            out.append(int(token))
    return out


def attention_maps(model: Any, source_ids: Any, target_ids: Sequence[int],
                   pieces: tuple[Callable[[list[int]], Sequence[str]], Callable[[list[int]], Sequence[str]]],
                   translation: str, bos_id: int = 2, eos_id: int = 3, pad_id: int = 0) -> AttentionMaps:
    """The `AttentionMaps` of a source and its translation, both as ids.

    Args:
        model: a `build_model` model.
        source_ids: the source ids, tokens then eos (no padding).
        target_ids: the translation's token ids, without bos, eos or padding (`strip_special`).
        pieces: `(source_pieces, target_pieces)`: functions from a list of ids to their subword strings.
        translation: the translation's text.
        bos_id, eos_id, pad_id: the target side's special ids.

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> words = lambda ids: [f"w{i}" for i in ids]
    >>> maps = attention_maps(model, [5, 6, 3], [9], (words, words), "w9")
    >>> maps.target_inputs, maps.target_outputs, maps.cross[0].shape
    (['w2', 'w9'], ['w9', 'w3'], (4, 2, 3))
    """
    source_pieces, target_pieces = pieces
    source_ids = [int(i) for i in np.asarray(source_ids).reshape(-1)]
    target_ids = [int(i) for i in target_ids]
    decoder_inputs = [bos_id] + target_ids  # (T,)
    decoder_outputs = target_ids + [eos_id]  # (T,)
    weights = attention_weights(model, np.asarray(source_ids, "int32"), np.asarray(decoder_inputs, "int32"),
                                pad_id=pad_id)
    return AttentionMaps(source_tokens=list(source_pieces(source_ids)),
                         target_inputs=list(target_pieces(decoder_inputs)),
                         target_outputs=list(target_pieces(decoder_outputs)), translation=translation, **weights)
