"""The machinery every search shares: limits, the cached decoder step, the search loop, checks.

How a batch is decoded (every strategy of this package):

1. The encoder runs once: memory `(B, S, D)`; the cross-attention keys and
   values of every decoder layer are projected from it once as well, heads-first
   `(B, H, S, d)`, one copy per sentence that its K rows share (K beams, or
   one row for greedy decoding and sampling).
2. Each step feeds only the newest token `(B*K, 1)` to the decoder
   (`step_function`). Its self-attention keys and values are written into each
   layer's two caches `(B*K, H, T, d)` at the step's position, so a step costs
   one token's worth of projections and attention reads the caches without
   transposing them. With `first_cache_stage` (as `Translator` decodes) the
   caches start with that many positions and grow once, to the whole output
   buffer, if a search runs longer (`cache_stages`, `search_loop`).
3. A strategy (`beam`, `greedy`, `sampling`) chooses the next tokens from the
   step's log-probabilities and keeps its own fixed-shape state. Greedy
   decoding and sampling keep one hypothesis per row and differ only in that
   choice: they share one loop (`one_token_search`), each giving it its own
   `choose`.

Everything is `keras.ops` inside `keras.ops.while_loop`s with fixed-shape
state, so the functions run eagerly, inside `tf.function`, with
`jit_compile=True`, and in a SavedModel.

An ensemble (a list of models sharing a vocabulary) decodes the same way:
each member encodes once and keeps its own caches, and each step scores
tokens by the log of the members' mean probability (what `score` computes
too), so scores stay log-probabilities of one distribution.

Padding never changes a result: each sentence's own length limit is computed
from its own (unpadded) source length, and padded source positions get exactly
zero attention.
"""

import math
import numbers
from typing import Any

import numpy as np
from keras import ops

from keras_transformer.decoding.strategies import ALPHA, MAX_EXTRA, valid_alpha
from keras_transformer.model import decode, encode, output_kernel, parts

NEG_INF = float("-inf")


def length_penalty(length: Any, alpha: float = 0.6) -> Any:
    """The GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al., 2016).

    Beam search ranks finished hypotheses by log P(Y | X) / lp(Y); with
    `alpha=0` this is the plain log-probability.

    Args:
        length: int tensor (any shape), the number of output tokens (with eos).
        alpha: the exponent; 0.6 in the paper.

    Returns:
        float32 tensor of the shape of `length`.

    Example:

    >>> float(length_penalty(1, alpha=0.6))
    1.0
    >>> round(float(length_penalty(7, alpha=1.0)), 4)
    2.0
    """
    length = ops.cast(length, "float32")
    return ops.power((5.0 + length) / 6.0, float(alpha))


def max_positions(model: Any) -> Any:
    """The longest target sequence `model` accepts (its positional-encoding length).

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> max_positions(build_model(TransformerConfig.preset("tiny", vocab_size=50)))
    128
    """
    return parts(model).target_position.max_length


def output_limits(model: Any, source: Any, pad_id: int = 0, max_extra: int = 50, max_length: int | None = None) -> Any:
    """How many tokens each sentence may produce, and the width of the output buffer.

    A sentence with `n` source tokens (its eos included, padding excluded) may
    produce `n + max_extra` tokens, capped by `max_length` and by the model's
    maximum target length.

    Args:
        model: a `build_model` model, or a list of them to decode as an ensemble
            (`ensemble_members`; the mean of their next-token distributions).
        source: int `(B, S)` token ids padded with `pad_id`.
        pad_id: the padding id.
        max_extra: extra tokens allowed beyond the source length (paper: 50); >= 0.
        max_length: optional absolute cap on output tokens.

    Returns:
        `(limits, steps)`: int32 `(B,)` per-sentence limits, and the buffer width
        `min(S + max_extra, cap)` (a Python int when `S` is static, which keeps
        every loop tensor's shape static for XLA).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> limits, steps = output_limits(model, np.array([[5, 3, 0], [5, 6, 3]]), max_extra=2)
    >>> limits.numpy().tolist(), steps
    ([4, 5], 5)
    """
    check_options("output_limits", max_extra=max_extra)
    cap = max_positions(model)
    if max_length is not None:
        cap = min(cap, int(max_length))
    width = ops.shape(source)[1]
    source_cap = parts(model).source_position.max_length
    if isinstance(width, int) and width > source_cap:
        raise ValueError(f"The source batch has {width} positions but the model accepts at most "
                         f"{source_cap}; truncate the sources (Translator does) or build a model "
                         f"with a larger max_length.")
    source_lengths = ops.sum(ops.cast(ops.not_equal(source, pad_id), "int32"), axis=1)  # (B,)
    limits = ops.clip(source_lengths + int(max_extra), 1, cap)  # (B,)
    if isinstance(width, int):
        steps = max(1, min(width + int(max_extra), cap))
    else:
        steps = ops.clip(width + int(max_extra), 1, cap)
    return limits, steps


# ----------------------------------------------------------------- helpers


def write_column(sequences: Any, column: Any, values: Any) -> Any:
    """Returns `sequences (..., T)` with `values (...)` written at `column`."""
    positions = ops.arange(ops.shape(sequences)[-1], dtype="int32")
    return ops.where(ops.equal(positions, column), ops.expand_dims(values, -1), sequences)


def token_ids(caller: str, name: str, ids: Any, model: Any = None, embedding: str = "source") -> Any:
    """`ids` as an int32 `(B, L)` tensor, or an error that names the problem.

    The rank is checked for any input; the values (integers, inside the
    model's vocabulary) when they are concrete (lists, numpy arrays), since a
    token id outside the vocabulary would otherwise fail deep in the embedding
    gather, or on some devices silently read another row.
    """
    if isinstance(ids, (list, tuple, np.ndarray)):
        array = np.asarray(ids)
        if array.ndim != 2:
            raise ValueError(f"{caller}: {name} must be token ids of shape (batch, length), got shape {array.shape}.")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise TypeError(f"{caller}: {name} must hold integer token ids, got dtype {array.dtype}.")
        layer = getattr(parts(model), f"{embedding}_embedding") if model is not None else None
        if layer is not None and array.size and (array.min() < 0 or array.max() >= layer.vocab_size):
            raise ValueError(f"{caller}: {name} ids must be in [0, {layer.vocab_size}) (the model's vocabulary), "
                             f"got values from {array.min()} to {array.max()}.")
    tensor = ops.convert_to_tensor(ids, "int32")
    if len(tensor.shape) != 2:
        raise ValueError(f"{caller}: {name} must be token ids of shape (batch, length), got shape {tensor.shape}.")
    return tensor


def target_prefix_ids(caller: str, prefix: Any, source: Any, model: Any, pad_id: int = 0, bos_id: int = 2,
                      eos_id: int = 3) -> Any:
    """`prefix` (forced first target tokens per sentence) as int32 `(B, P)`, or an error naming the problem.

    A prefix row holds a sentence's forced tokens then `pad_id` padding (P = 0, or a row of padding only:
    nothing forced). Where the ids are concrete (lists, numpy arrays), they are checked: one row per source
    sentence, ids inside the target vocabulary, no bos or eos (a prefix is continued; bos is never produced),
    no token after padding, and fewer tokens than the model's longest output (at least one is decoded).
    Tensors (a SavedModel's input) are taken as they are; `Translator` checks them in the graph.

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tuple(target_prefix_ids("greedy_decode", [[7, 9], [8, 0]], [[5, 3], [6, 3]], model).shape)
    (2, 2)
    >>> target_prefix_ids("greedy_decode", [[7, 3]], [[5, 3]], model)
    Traceback (most recent call last):
    ...
    ValueError: greedy_decode: target_prefix row 0 holds eos (3); a prefix is forced and then continued, ...
    """
    if isinstance(prefix, (list, tuple)) and all(isinstance(row, (list, tuple)) and not row for row in prefix):
        prefix = np.zeros((len(prefix), 0), "int32")  # rows of nothing forced
    ids = token_ids(caller, "target_prefix", prefix, model, embedding="target")
    check_same_batch(caller, source, ids, "target prefix")
    if isinstance(prefix, (list, tuple, np.ndarray)):
        cap = max_positions(model) if model is not None else None
        for row, values in enumerate(np.asarray(prefix).reshape(len(prefix), -1)):
            tokens = values[values != pad_id]
            for special, name in ((eos_id, "eos"), (bos_id, "bos")):
                if special in tokens:
                    raise ValueError(f"{caller}: target_prefix row {row} holds {name} ({special}); a prefix is forced "
                                     "and then continued, without bos or eos.")
            if len(tokens) and np.flatnonzero(values != pad_id)[-1] >= len(tokens):
                raise ValueError(f"{caller}: target_prefix row {row} has a token after padding ({pad_id}); "
                                 "give each row's tokens first, then padding.")
            if cap is not None and len(tokens) >= cap:
                raise ValueError(f"{caller}: target_prefix row {row} has {len(tokens)} tokens; the model produces "
                                 f"at most {cap} (its max_length), so a prefix has at most {cap - 1}.")
    return ids


def split_start(prefix: Any, bos_id: int = 2, pad_id: int = 0) -> Any:
    """`start_from_prefix`: `target_prefix_ids` `(B, P)` -> `(starts (B,), prefix (B, P))`, each sentence's decoder
    start (its prefix's first token, `bos_id` where nothing is forced: mBART-large-cc25's target language) and the
    rest of its prefix, padded by one column."""
    padded = ops.pad(prefix, [[0, 0], [0, 1]], constant_values=pad_id)  # (B, P + 1)
    first = padded[:, 0]
    return ops.where(ops.equal(first, pad_id), bos_id, first), padded[:, 1:]


def prefix_lengths(prefix: Any, pad_id: int = 0) -> Any:
    """int32 `(B,)`: the forced tokens of each `target_prefix_ids` row (those that are not `pad_id`)."""
    return ops.sum(ops.cast(ops.not_equal(prefix, pad_id), "int32"), axis=1)


def with_prefix_room(limits: Any, steps: Any, prefix: Any, model: Any, pad_id: int = 0) -> Any:
    """`output_limits`' `(limits, steps)` widened so that every sentence decodes at least one token after its
    target prefix (capped by the model's longest output, which `target_prefix_ids` keeps prefixes under)."""
    cap = max_positions(model)
    limits = ops.minimum(ops.maximum(limits, prefix_lengths(prefix, pad_id) + 1), cap)  # (B,)
    width = ops.shape(prefix)[1]
    if isinstance(width, int) and isinstance(steps, int):
        return limits, min(max(steps, width + 1), cap)
    return limits, ops.minimum(ops.maximum(steps, width + 1), cap)


def forced_token(prefix: Any, t: Any, pad_id: int = 0) -> Any:
    """At step `t` (from 0), each row's forced token and whether it is forced: `(tokens (N,), forced (N,))`.

    `prefix` is `(N, P + 1)`: `target_prefix_ids` rows with one more column of padding, so that every step
    past the prefix reads padding (not forced) whatever P is.
    """
    column = ops.minimum(t, ops.shape(prefix)[1] - 1)
    token = ops.take(prefix, column, axis=1)  # (N,)
    return token, ops.not_equal(token, pad_id)


def prefix_rows(prefix: Any, rows_per_sentence: Any, pad_id: int = 0) -> Any:
    """`target_prefix_ids` `(B, P)` -> `(B*R, P + 1)`: each sentence's prefix for each of its R rows, padded by
    one column (`forced_token`)."""
    prefix = ops.pad(prefix, [[0, 0], [0, 1]], constant_values=pad_id)
    return ops.repeat(prefix, rows_per_sentence, axis=0) if rows_per_sentence > 1 else prefix


def check_options(caller: str, max_extra: int = 0, alpha: float = 0.0) -> None:
    """Refuses a negative `max_extra` and a negative or non-finite `alpha`, naming `caller`.

    Only Python (and numpy) numbers are checked; these options are never
    traced, so a check here costs nothing inside `tf.function` or XLA.

    Example:

    >>> check_options("beam_search", max_extra=50, alpha=0.6)
    >>> check_options("beam_search", alpha=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: beam_search: alpha (the length-penalty exponent) must be a finite number >= 0 (...), got nan.
    """
    if isinstance(max_extra, numbers.Real) and not max_extra >= 0:
        raise ValueError(f"{caller}: {MAX_EXTRA[0]} must be >= 0, got {max_extra}.")
    if isinstance(alpha, numbers.Real) and not valid_alpha(alpha):
        raise ValueError(f"{caller}: {ALPHA[0]} must be {ALPHA[1]}, got {alpha}.")


def check_same_batch(caller: str, source: Any, target: Any, what: str = "target") -> None:
    """Refuses a source and a target batch (or `what` batch) of different sizes where both sizes are known."""
    sources, targets = ops.shape(source)[0], ops.shape(target)[0]
    if isinstance(sources, int) and isinstance(targets, int) and sources != targets:
        raise ValueError(f"{caller}: {sources} source sentence(s) but {targets} {what}(s); "
                         f"give one {what} per source.")


def ensemble_members(model: Any) -> Any:
    """`model`, or a list of models decoded as one ensemble, as a checked list.

    Members must agree on everything decoding relies on: the output vocabulary
    and the source and target length limits (they may differ in anything
    else: layers, norm placement, d_model). Their special ids are the caller's
    (one `pad_id`/`bos_id`/`eos_id` for all), so they must share the
    vocabulary itself, not only its size; `load_translator` checks the files.

    Args:
        model: a `build_model` model or a non-empty list/tuple of them.

    Returns:
        A list of models.

    Raises:
        ValueError: an empty list, or members that disagree (named).

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> config = TransformerConfig.preset("tiny", vocab_size=50)
    >>> len(ensemble_members([build_model(config), build_model(config)]))
    2
    """
    models = list(model) if isinstance(model, (list, tuple)) else [model]
    if not models:
        raise ValueError("An ensemble needs at least one model; got an empty list.")
    checks = (("an output vocabulary of", lambda m: int(m.outputs[0].shape[-1])),
              ("a source max_length of", lambda m: parts(m).source_position.max_length),
              ("a target max_length of", max_positions))
    for index, other in enumerate(models[1:], start=1):
        for what, read in checks:
            if read(other) != read(models[0]):
                raise ValueError(f"Ensemble member {index} has {what} {read(other)} but member 0 has "
                                 f"{read(models[0])}: ensembled models must share the vocabulary and length limits.")
    return models


def _member_step(model: Any, source: Any, pad_id: int, beams: Any, steps: Any, use_cache: bool,
                 cache_length: Any) -> Any:
    """One model's half of `step_function`: `(step, cache)` returning the newest position's float32 logits."""
    memory, source_padding = encode(model, source, pad_id)  # (B, S, D), (B, S)
    decoder = parts(model).decoder

    if use_cache:
        # Cross-attention: N pairs (B, H, S, dk), (B, H, S, dv), one row per sentence shared by its K beams.
        # Self-attention: N pairs (B*K, H, T, dk), (B*K, H, T, dv), T = the first cache stage (grown later).
        cross = decoder.cross_attention_cache(memory)
        cache = decoder.initial_cache(ops.shape(source)[0] * beams, cache_length)
        kernel = output_kernel(model)  # (D, V), transposed once here rather than at every step

        def step(sequences: Any, t: Any, cache: Any) -> Any:
            token = ops.expand_dims(ops.take(sequences, t, axis=1), 1)  # (B*K, 1)
            logits, cache = decode(model, token, None, source_padding, self_attention_cache=cache,
                                   cache_index=t, cross_attention_cache=cross, beam_size=beams,
                                   output_kernel=kernel)
            return ops.cast(logits[:, 0], "float32"), cache
        return step, cache

    memory = ops.repeat(memory, beams, axis=0)  # (B*K, S, D)
    source_padding = ops.repeat(source_padding, beams, axis=0)  # (B*K, S)

    def uncached_step(sequences: Any, t: Any, cache: Any) -> Any:
        logits = decode(model, sequences[:, :steps], memory, source_padding)  # (B*K, T_max, V)
        return ops.cast(ops.take(logits, t, axis=1), "float32"), cache
    return uncached_step, ()


def combine(log_probs: Any) -> Any:
    """Members' next-token log-probabilities -> the ensemble's: log of the mean probability."""
    if len(log_probs) == 1:
        return log_probs[0]
    return ops.logsumexp(ops.stack(log_probs), axis=0) - math.log(len(log_probs))


def step_function(models: Any, source: Any, pad_id: int, beams: Any, steps: Any, use_cache: bool,
                  cache_length: Any, starts: Any = None) -> Any:
    """Encodes `source` once per model and returns `(step, cache)` for a `(B*beams)`-row decoder.

    `step(sequences, t, cache)` takes the token buffer `(B*beams, steps + 1)`
    (column 0 is bos, column t the newest token) and returns
    `(values (B*beams, V), normalizer (B*beams, 1), cache)`: the next-token
    log-probabilities are `values - normalizer`, left for the caller to compute
    on the few entries it keeps (one model: its logits and their logsumexp; an
    ensemble: the log of the members' mean probability and 0). They are the
    model's own (not renormalised after excluding pad and bos), so scores
    match `score`.

    The cache is a flat tuple of every member's per-layer `(keys, values)`
    pairs (the beam reorder gathers each tensor). With `use_cache=False` each
    step reruns the decoder over the whole fixed-width prefix buffer (the
    baseline the benchmark compares with) and the cache is a dummy tensor.
    With `starts` (int32 `(B,)`, `split_start`), each sentence's decoder reads its own start token in
    column 0 in place of bos.
    """
    if starts is not None:
        starts = ops.repeat(starts, beams, axis=0)  # (B*beams,)
    members = [_member_step(m, source, pad_id, beams, steps, use_cache, cache_length) for m in models]
    sizes = [len(cache) for _, cache in members]
    cache = tuple(pair for _, member_cache in members for pair in member_cache) if use_cache else ops.zeros((1,))

    def step(sequences: Any, t: Any, cache: Any) -> Any:
        if starts is not None:
            sequences = write_column(sequences, 0, starts)  # (B*beams, steps + 1)
        outputs, updated, start = [], [], 0
        for (member, _), size in zip(members, sizes):
            logits, member_cache = member(sequences, t, cache[start:start + size] if use_cache else ())
            outputs.append(logits)
            updated.extend(member_cache)
            start += size
        cache = tuple(updated) if use_cache else cache
        if len(outputs) == 1:
            return outputs[0], ops.logsumexp(outputs[0], axis=-1, keepdims=True), cache
        combined = combine([ops.log_softmax(logits, axis=-1) for logits in outputs])
        return combined, ops.zeros_like(combined[:, :1]), cache
    return step, cache


def excluded(tokens: Any, pad_id: int, bos_id: int, eos_id: int | None = None) -> Any:
    """True where a token id is one that is never produced: padding, and bos unless it is the eos id (a decoder
    that starts from eos, as M2M-100's, still ends with it)."""
    if bos_id == eos_id:
        return ops.equal(tokens, pad_id)
    return ops.logical_or(ops.equal(tokens, pad_id), ops.equal(tokens, bos_id))


# The self-attention caches can grow in two stages: the search first runs a loop over caches of a
# few positions, and only if some sentence needs more steps pads them to the whole output buffer and
# goes on in a second loop. Writing a step's keys and values, reordering the beams and attending all
# cost in proportion to the cache length, and most outputs are short, so most steps then work on a
# short cache instead of the `source length + max_extra` buffer. The second loop's body is traced
# too, which a process pays once per search shape; `Translator` (and so every export) uses stages,
# the functions here only when asked (`first_cache_stage`).
FIRST_CACHE_STAGE = 32


def cache_stages(steps: Any, first_cache_stage: int | None = None) -> Any:
    """The cache lengths of the successive search loops for an output buffer of `steps` positions.

    `[first_cache_stage, steps]`, or `[steps]` without a first stage or when the buffer is not
    longer than it. `steps` may be a tensor (a source width unknown until run time); the first
    stage is then always used.

    Example:

    >>> cache_stages(90, 32), cache_stages(32, 32), cache_stages(90)
    ([32, 90], [32], [90])
    """
    if first_cache_stage is None:
        return [steps]
    first = int(first_cache_stage)
    if first < 1:
        raise ValueError("first_cache_stage must be a positive number of positions (or None), "
                         f"got {first_cache_stage}.")
    if isinstance(steps, int) and steps <= first:
        return [steps]
    return [first, steps]


def _grow(cache: Any, length: Any) -> Any:
    """Pads every `(rows, H, T, d)` cache tensor to at least `length` positions (zeros, which attention masks out).

    With a static `length` the padding is a Python int (XLA and JAX need static shapes); a
    `length` known only at run time (TensorFlow graphs) gives caches of unknown length.
    """
    def padded(tensor: Any) -> Any:
        current = tensor.shape[2]
        if isinstance(length, int) and isinstance(current, int):
            extra = max(length - current, 0)
        else:
            extra = ops.maximum(length - ops.shape(tensor)[2], 0)
        return ops.pad(tensor, [[0, 0], [0, 0], [0, extra], [0, 0]])
    return tuple(tuple(padded(tensor) for tensor in pair) for pair in cache)


def search_loop(cond: Any, body: Any, state: Any, stages: Any) -> Any:
    """`while cond(state): state = body(state)`, one `while_loop` per cache length in `stages`.

    A loop runs while `cond` holds and the step `t` still fits its cache; the caches then grow to
    the next length. With one stage this is a single `while_loop`.
    """
    for index, length in enumerate(stages):
        if index:
            state = {**state, "cache": _grow(state["cache"], length)}

        def fits(state: Any, length: Any = length) -> Any:
            return ops.logical_and(ops.less(state["t"], length), cond(state))
        state = ops.while_loop(fits, body, state)
    return state


def one_token_search(models: Any, source: Any, choose: Any, rows_per_sentence: int = 1, max_extra: int = 50,
                     max_length: int | None = None, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3,
                     use_cache: bool = True, first_cache_stage: int | None = None, caller: str = "one_token_search",
                     target_prefix: Any = None,
                     bans: Any = None, start_from_prefix: bool = False) -> Any:
    """The loop of the strategies that keep one hypothesis per row and only choose its next token (greedy, sampling).

    Each sentence gets `rows_per_sentence` rows (R; its cross-attention keys and values are shared by them, as
    by beams). At every step each unfinished row appends `choose(log_probs, t)` and adds that token's
    log-probability to its score; a row is finished after eos or at its sentence's length limit, and then
    appends padding. The loop stops when every row is finished.

    Args:
        models: a list of `build_model` models (`ensemble_members`).
        source: int32 `(B, S)` source ids, padded with `pad_id`.
        choose: `(log_probs (B*R, V), t) -> int32 (B*R,)`, the next token of every row from the model's
            next-token log-probabilities (pad and bos already -inf) at step `t` (int32 scalar, from 0).
            Row `b * R + r` is sample `r` of sentence `b`.
        rows_per_sentence: R, rows per sentence (a Python int).
        max_extra, max_length, pad_id, bos_id, eos_id, use_cache, first_cache_stage, target_prefix: as in
            `greedy_decode`; a row's forced tokens replace what `choose` gave at their steps.
        caller: the name errors give.
        bans: optional banned phrases, a `constraints.Bans`: `choose` sees their completions at -inf (the scores
            stay the model's log-probabilities).
        start_from_prefix: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(B, R, T)` outputs (prefix included) padded with `pad_id`, float32 `(B, R)`
        log P(tokens | source) under the model's own distribution (whatever `choose` did).

    Example:

    >>> import numpy as np
    >>> from keras import ops
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> always_9 = lambda log_probs, t: ops.full(ops.shape(log_probs)[:1], 9, "int32")
    >>> tokens, scores = one_token_search([model], np.array([[7, 8, 3]]), always_9, rows_per_sentence=2,
    ...                                   max_extra=1)
    >>> tokens.numpy().tolist(), tuple(scores.shape)
    ([[[9, 9, 9, 9], [9, 9, 9, 9]]], (1, 2))
    """
    check_options(caller, max_extra=max_extra)
    models = ensemble_members(models)
    rows = int(rows_per_sentence)
    source = token_ids(caller, "source", source, models[0])
    limits, steps = output_limits(models[0], source, pad_id, max_extra, max_length)  # (B,), T_max
    if target_prefix is not None:
        target_prefix = target_prefix_ids(caller, target_prefix, source, models[0], pad_id, bos_id, eos_id)
        if start_from_prefix:
            starts, target_prefix = split_start(target_prefix, bos_id, pad_id)  # (B,), (B, P)
        limits, steps = with_prefix_room(limits, steps, target_prefix, models[0], pad_id)
        forced_rows = prefix_rows(target_prefix, rows, pad_id)  # (B*R, P + 1)
    if rows > 1:
        limits = ops.repeat(limits, rows, axis=0)  # (B*R,)
    stages = cache_stages(steps, first_cache_stage) if use_cache else [steps]
    step, cache = step_function(models, source, pad_id, rows, steps, use_cache, stages[0],
                                starts if start_from_prefix and target_prefix is not None else None)
    batch = ops.shape(source)[0] * rows

    sequences = write_column(ops.full((batch, steps + 1), pad_id, dtype="int32"), 0,
                              ops.full((batch,), bos_id, dtype="int32"))  # (B*R, T_max + 1)
    state = {
        "t": ops.convert_to_tensor(0, "int32"),
        "sequences": sequences,
        "cache": cache,
        "scores": ops.zeros((batch,), "float32"),
        "finished": ops.zeros((batch,), "bool"),
    }

    def cond(state: Any) -> Any:
        return ops.logical_and(ops.less(state["t"], steps), ops.logical_not(ops.all(state["finished"])))

    def body(state: Any) -> Any:
        t, finished = state["t"], state["finished"]
        values, normalizer, cache = step(state["sequences"], t, state["cache"])  # (B*R, V), (B*R, 1)
        log_probs = values - normalizer
        vocab = ops.arange(ops.shape(log_probs)[-1], dtype="int32")
        log_probs = ops.where(excluded(vocab, pad_id, bos_id, eos_id), NEG_INF, log_probs)  # (B*R, V)
        allowed = log_probs if bans is None else bans.apply(log_probs, state["sequences"], t, rows)
        token = ops.cast(choose(allowed, t), "int32")  # (B*R,)
        if target_prefix is not None:  # a prefix's tokens are forced, whatever was chosen
            forced, is_forced = forced_token(forced_rows, t, pad_id)
            token = ops.where(is_forced, forced, token)
        token = ops.where(finished, pad_id, token)
        gain = ops.take_along_axis(log_probs, ops.expand_dims(token, 1), axis=1)[:, 0]  # (B*R,)
        scores = state["scores"] + ops.where(finished, 0.0, gain)
        finished = finished | ops.equal(token, eos_id) | ops.greater_equal(t + 1, limits)
        return {"t": t + 1, "sequences": write_column(state["sequences"], t + 1, token),
                "cache": cache, "scores": scores, "finished": finished}

    state = search_loop(cond, body, state, stages)
    tokens = state["sequences"][:, 1:]  # (B*R, T_max)
    return ops.reshape(tokens, (-1, rows, ops.shape(tokens)[1])), ops.reshape(state["scores"], (-1, rows))
