"""Forced decoding: the model's log-probability of given translations."""

from typing import Any

from keras import ops

from keras_transformer.decoding.search import (
    check_options,
    check_same_batch,
    combine,
    ensemble_members,
    length_penalty,
    token_ids,
)
from keras_transformer.model import decode, encode


def score(model: Any, source: Any, target: Any, alpha: float = 0.0, pad_id: int = 0, bos_id: int = 2,
          start_from_prefix: bool = False) -> Any:
    """Forced decoding: the model's log P(target | source), optionally length-normalised.

    Runs the teacher-forced pass once (decoder input = bos + target[:-1]) and
    sums the log-probabilities of the target tokens. Scores of `greedy_decode`
    and `beam_search` outputs (with the same `alpha`) agree with this.

    Args:
        model: a `build_model` model, or a list of them to decode as an ensemble
            (`ensemble_members`; the mean of their next-token distributions).
        source: int `(B, S)` source ids (tokens then eos), padded with `pad_id`.
        target: int `(B, T)` target ids (tokens then eos), padded with `pad_id`: one
            row per source row (a batch of another size is refused, naming both).
        alpha: length-penalty exponent, finite and >= 0; 0 gives the plain log-probability.
        pad_id, bos_id: the special ids.
        start_from_prefix: each target row's first token is the decoder's start, not scored (mBART-large-cc25's
            target language, as the searches' `start_from_prefix`): decoder input = target[:-1].

    Returns:
        float32 `(B,)`: sum of log-probabilities / lp(target length).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tuple(score(model, np.array([[7, 8, 3]]), np.array([[9, 3, 0]])).shape)
    (1,)
    """
    first = ensemble_members(model)[0]
    source = token_ids("score", "source", source, first)
    target = token_ids("score", "target", target, first, embedding="target")
    check_same_batch("score", source, target)
    check_options("score", alpha=alpha)
    if start_from_prefix:
        decoder_input, target = target[:, :-1], target[:, 1:]  # (B, T - 1): the start, then the tokens
    else:
        bos = ops.full((ops.shape(target)[0], 1), bos_id, dtype="int32")
        decoder_input = ops.concatenate([bos, target[:, :-1]], axis=1)  # (B, T), shifted right
    members = []
    for member in ensemble_members(model):
        memory, source_padding = encode(member, source, pad_id)
        logits = decode(member, decoder_input, memory, source_padding)  # (B, T, V)
        members.append(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
    log_probs = combine(members)
    token_log_probs = ops.take_along_axis(log_probs, ops.expand_dims(target, -1), axis=-1)[..., 0]  # (B, T)
    real = ops.not_equal(target, pad_id)
    total = ops.sum(ops.where(real, token_log_probs, 0.0), axis=1)
    return total / length_penalty(ops.sum(ops.cast(real, "int32"), axis=1), alpha)
