"""Greedy decoding: the most probable next token at every step, one hypothesis per sentence."""

from typing import Any

from keras import ops

from keras_transformer.decoding.beam import beam_search
from keras_transformer.decoding.constraints import Bans, banned_ids
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.search import ensemble_members, one_token_search, token_ids


def greedy_decode(model: Any, source: Any, max_extra: int = 50, max_length: int | None = None, pad_id: int = 0,
                  bos_id: int = 2, eos_id: int = 3, use_cache: bool = True, first_cache_stage: int | None = None,
                  target_prefix: Any = None, constraints: Any = None, banned: Any = None,
                  start_from_prefix: bool = False) -> tuple[Any, Any]:
    """Decodes a batch by taking the most likely token at every step.

    Args:
        model: a `build_model` model, or a list of them to decode as an ensemble
            (`ensemble_members`; the mean of their next-token distributions).
        source: int `(B, S)` source ids (tokens then eos), padded with `pad_id`.
        max_extra: each sentence produces at most its source length + `max_extra` tokens (>= 0).
        max_length: optional absolute cap on output tokens (the model's own
            maximum length always applies).
        pad_id, bos_id, eos_id: the special ids (`TransformerConfig` defaults).
        use_cache: decode with the key/value cache (True), or rerun the decoder
            over the whole prefix at every step (False; for benchmarks and tests).
        first_cache_stage: with a cache, first decode over caches of this many
            positions and grow them to the whole buffer only if a sentence needs
            more steps (faster for short outputs; one more loop to trace; the
            same output). None: one loop over the whole buffer. `Translator`
            uses `FIRST_CACHE_STAGE`.
        target_prefix: optional int `(B, P)` forced first output tokens per
            sentence, padded with `pad_id` (`search.target_prefix_ids`): they
            are produced first, whatever the model prefers, then decoding goes
            on from them. A sentence may produce at least its prefix and one
            more token.
        constraints: optional phrases every output must contain, as in
            `beam_search`: the search is then `beam_search` with one beam,
            `alpha=0` and these constraints (dynamic beam allocation with one
            beam puts each constraint's tokens in as soon as it can).
        banned: optional phrases no output may contain, as in `beam_search`.
        start_from_prefix: each sentence's decoder starts from the first token of its
            `target_prefix` (`bos_id` where nothing is forced), which is then not
            an output: mBART-large-cc25 starts from its target language
            (`TransformerConfig.start_from_prefix`).

    Returns:
        `(tokens, scores)`: int32 `(B, T)` outputs (the prefix, then the
        decoded tokens) ending with eos (unless cut by the length limit),
        padded with `pad_id`; float32 `(B,)` log P(tokens | source), the
        prefix's tokens included (what `score` gives the whole output).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tokens, scores = greedy_decode(model, np.array([[7, 8, 3], [9, 3, 0]]), max_extra=4)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((2, 7), (2,))
    """
    def most_probable(log_probs: Any, t: Any) -> Any:  # (B, V) -> (B,)
        return ops.argmax(log_probs, axis=-1)

    if constraints is not None:  # greedy decoding with constraints is beam 1's
        tokens, scores = beam_search(model, source, beam_size=1, alpha=0.0, max_extra=max_extra,
                                     max_length=max_length, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                                     use_cache=use_cache, first_cache_stage=first_cache_stage,
                                     target_prefix=target_prefix, constraints=constraints, banned=banned,
                                     start_from_prefix=start_from_prefix)
        return tokens[:, 0], scores[:, 0]
    bans = None
    if banned is not None:
        checked = token_ids("greedy_decode", "source", source, ensemble_members(model)[0])
        bans = Bans(banned_ids("greedy_decode", banned, checked, ensemble_members(model)[0], pad_id, bos_id, eos_id),
                    pad_id)
    tokens, scores = one_token_search(model, source, most_probable, 1, max_extra, max_length, pad_id, bos_id,
                                      eos_id, use_cache, first_cache_stage, caller="greedy_decode",
                                      target_prefix=target_prefix, bans=bans,
                                      start_from_prefix=start_from_prefix)
    return tokens[:, 0], scores[:, 0]


def decode(models: Any, source: Any, options: DecodeOptions, pad_id: int, bos_id: int, eos_id: int,
           first_cache_stage: int | None = None, row_keys: Any = None, target_prefix: Any = None,
           constraints: Any = None, banned: Any = None, start_from_prefix: bool = False) -> tuple[Any, Any]:
    """The strategy's search (`strategies.GreedySearch`): `greedy_decode` with `options` (and
    `target_prefix`, `constraints` and `banned`, as there).

    Returns int32 `(B, 1, T)` and float32 `(B, 1)` scores log P(tokens | source) (no length penalty).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> from keras_transformer.decoding import DecodeOptions
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tokens, scores = decode([model], np.array([[7, 8, 3]]), DecodeOptions(strategy="greedy", max_extra=3),
    ...                         pad_id=0, bos_id=2, eos_id=3)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 1, 6), (1, 1))
    """
    tokens, scores = greedy_decode(models, source, max_extra=options.max_extra, pad_id=pad_id, bos_id=bos_id,
                                   eos_id=eos_id, first_cache_stage=first_cache_stage, target_prefix=target_prefix,
                                   constraints=constraints, banned=banned, start_from_prefix=start_from_prefix)
    return ops.expand_dims(tokens, 1), ops.expand_dims(scores, 1)
