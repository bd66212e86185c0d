"""Greedy decoding: the most probable next token at every step, one hypothesis per sentence."""

from keras import ops

from keras_transformer.decoding.search import (NEG_INF, cache_stages, check_options, ensemble_members, excluded,
                                               output_limits, search_loop, step_function, token_ids, write_column)


def greedy_decode(model, source, max_extra=50, max_length=None, pad_id=0, bos_id=2, eos_id=3,
                  use_cache=True, first_cache_stage=None):
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

    Returns:
        `(tokens, scores)`: int32 `(B, T)` outputs ending with eos (unless cut
        by the length limit), padded with `pad_id`; float32 `(B,)` log P(tokens | source).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tokens, scores = greedy_decode(model, np.array([[7, 8, 3], [9, 3, 0]]), max_extra=4)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((2, 7), (2,))
    """
    check_options("greedy_decode", max_extra=max_extra)
    models = ensemble_members(model)
    source = token_ids("greedy_decode", "source", source, models[0])
    batch = ops.shape(source)[0]
    limits, steps = output_limits(models[0], source, pad_id, max_extra, max_length)  # (B,), T_max
    stages = cache_stages(steps, first_cache_stage) if use_cache else [steps]
    step, cache = step_function(models, source, pad_id, 1, steps, use_cache, stages[0])

    sequences = write_column(ops.full((batch, steps + 1), pad_id, dtype="int32"), 0,
                              ops.full((batch,), bos_id, dtype="int32"))  # (B, T_max + 1)
    state = {
        "t": ops.convert_to_tensor(0, "int32"),
        "sequences": sequences,
        "cache": cache,
        "scores": ops.zeros((batch,), "float32"),
        "finished": ops.zeros((batch,), "bool"),
    }

    def cond(state):
        return ops.logical_and(ops.less(state["t"], steps), ops.logical_not(ops.all(state["finished"])))

    def body(state):
        t, finished = state["t"], state["finished"]
        values, normalizer, cache = step(state["sequences"], t, state["cache"])  # (B, V), (B, 1)
        log_probs = values - normalizer
        vocab = ops.arange(ops.shape(log_probs)[-1], dtype="int32")
        log_probs = ops.where(excluded(vocab, pad_id, bos_id), NEG_INF, log_probs)  # (B, V)
        token = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (B,)
        token = ops.where(finished, pad_id, token)
        gain = ops.take_along_axis(log_probs, ops.expand_dims(token, 1), axis=1)[:, 0]  # (B,)
        scores = state["scores"] + ops.where(finished, 0.0, gain)
        finished = finished | ops.equal(token, eos_id) | ops.greater_equal(t + 1, limits)
        return {"t": t + 1, "sequences": write_column(state["sequences"], t + 1, token),
                "cache": cache, "scores": scores, "finished": finished}

    state = search_loop(cond, body, state, stages)
    return state["sequences"][:, 1:], state["scores"]


def decode(models, source, options, pad_id, bos_id, eos_id, first_cache_stage=None, row_keys=None):
    """The strategy's entry (`keras_transformer.decoding.STRATEGIES`): `greedy_decode` with `options`.

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
                                   eos_id=eos_id, first_cache_stage=first_cache_stage)
    return ops.expand_dims(tokens, 1), ops.expand_dims(scores, 1)
