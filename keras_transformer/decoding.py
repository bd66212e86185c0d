"""Greedy decoding, beam search and forced-decode scoring for a `build_model` Transformer.

Decoding as the paper used it: beam search with beam 4 and the GNMT length
penalty lp(Y) = ((5 + |Y|) / 6) ** alpha with alpha = 0.6, at most
"source length + 50" output tokens, batched over sentences of different
lengths.

How a batch is decoded:

1. The encoder runs once: memory `(B, S, D)`; the cross-attention keys and
   values of every decoder layer are projected from it once as well, heads-first
   `(B, H, S, d)`, one copy per sentence that its K beams share.
2. Each step feeds only the newest token `(B*K, 1)` to the decoder. Its
   self-attention keys and values are written into each layer's two caches
   `(B*K, H, T, d)` at the step's position, so a step costs one token's
   worth of projections and attention reads the caches without transposing them.
   With `first_cache_stage` (as `Translator` decodes) the caches start with
   that many positions and grow once, to the whole output buffer, if a search
   runs longer (`cache_stages`).
3. Beam search keeps `K` alive and `K` finished hypotheses per sentence in
   fixed-shape tensors; when hypotheses are reordered, each layer's cache rows
   are reordered with one gather per tensor. Candidates are chosen from each
   hypothesis's own best `2K + 2` tokens, so the full `(B, K*V)` score table is
   never built.

Everything is `keras.ops` inside one `keras.ops.while_loop` with fixed-shape
state, so the functions run eagerly, inside `tf.function`, with
`jit_compile=True`, and in a SavedModel. The loop stops as soon as no
sentence's returned hypotheses can change any more.

An ensemble (a list of models sharing a vocabulary) decodes the same way:
each member encodes once and keeps its own caches, and each step scores
tokens by the log of the members' mean probability (what `score` computes
too), so beam scores stay log-probabilities of one distribution.

Padding never changes a result: each sentence's own length limit is computed
from its own (unpadded) source length, and padded source positions get exactly
zero attention.
"""

import math
import numbers

import numpy as np

from keras import ops

from keras_transformer.model import decode, encode, output_kernel, parts

NEG_INF = float("-inf")


def length_penalty(length, alpha=0.6):
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


def max_positions(model):
    """The longest target sequence `model` accepts (its positional-encoding length).

    Example:

    >>> from keras_transformer import TransformerConfig, build_model
    >>> max_positions(build_model(TransformerConfig.preset("tiny", vocab_size=50)))
    128
    """
    return parts(model).target_position.max_length


def output_limits(model, source, pad_id=0, max_extra=50, max_length=None):
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


def _write_column(sequences, column, values):
    """Returns `sequences (..., T)` with `values (...)` written at `column`."""
    positions = ops.arange(ops.shape(sequences)[-1], dtype="int32")
    return ops.where(ops.equal(positions, column), ops.expand_dims(values, -1), sequences)


def top_k_by_blocks(values, k, block=32):
    """`ops.top_k(values, k)` over the last axis of `values (R, V)`, reading most of each row only once.

    The row is cut into blocks of `block` ids; the `k` blocks with the largest maxima hold the
    row's `k` largest values (each of those values lies in a block whose maximum is at least as
    large, and at most `k` blocks can rank above it), so one `top_k` over the block maxima and one
    over those blocks' `k * block` values give the same result as a `top_k` over all `V`, ties
    included (the lower id first: the chosen blocks are kept in id order). A full-vocabulary
    `top_k` cost as much as the output projection in a batch's decoding step.

    Args:
        values: float `(R, V)`.
        k: how many to keep per row.
        block: ids per block.

    Returns:
        `(top_values (R, k), ids (R, k))`, as `ops.top_k`.

    Example:

    >>> import numpy as np
    >>> values = np.array([[0.0, 5.0, 1.0, 5.0, 2.0, 9.0, 0.0]], "float32")
    >>> [x.numpy().tolist() for x in top_k_by_blocks(values, 3, block=2)]
    [[[9.0, 5.0, 5.0]], [[5, 1, 3]]]
    """
    vocab = int(values.shape[-1])
    blocks = -(-vocab // block)
    if blocks <= k:
        return ops.top_k(values, k)
    if blocks * block != vocab:
        values = ops.pad(values, [[0, 0], [0, blocks * block - vocab]], constant_values=NEG_INF)
    grid = ops.reshape(values, (-1, blocks, block))  # (R, blocks, block)
    chosen = ops.cast(ops.sort(ops.top_k(ops.max(grid, axis=-1), k)[1], axis=-1), "int32")  # (R, k), id order
    rows = ops.shape(grid)[0]
    flat = ops.expand_dims(ops.arange(rows, dtype="int32") * blocks, 1) + chosen  # (R, k)
    candidates = ops.reshape(ops.take(ops.reshape(grid, (-1, block)), ops.reshape(flat, (-1,)), axis=0),
                             (-1, k * block))  # (R, k * block)
    top_values, position = ops.top_k(candidates, k)
    position = ops.cast(position, "int32")
    block_of = ops.take_along_axis(chosen, position // block, axis=1)
    return top_values, block_of * block + position % block


def _flat_index(beam_index, beams):
    """`(B, M)` beam numbers -> `(B*M,)` row numbers of a `(B*beams, ...)` tensor."""
    batch = ops.shape(beam_index)[0]
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * beams, 1)  # (B, 1)
    return ops.reshape(offsets + ops.cast(beam_index, "int32"), (-1,))


def _gather_beams(x, beam_index):
    """`x (B, K, ...)`, `beam_index (B, M)` -> `(B, M, ...)`: x[b, beam_index[b, m]]."""
    shape = ops.shape(x)
    flat = ops.reshape(x, (shape[0] * shape[1], *shape[2:]))
    picked = ops.take(flat, _flat_index(beam_index, shape[1]), axis=0)
    return ops.reshape(picked, (shape[0], ops.shape(beam_index)[1], *shape[2:]))


def _token_ids(caller, name, ids, model=None, embedding="source"):
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


def check_options(caller, max_extra=0, alpha=0.0):
    """Refuses a negative `max_extra` and a negative or non-finite `alpha`, naming `caller`.

    Only Python (and numpy) numbers are checked; these options are never
    traced, so a check here costs nothing inside `tf.function` or XLA.

    Example:

    >>> check_options("beam_search", max_extra=50, alpha=0.6)
    >>> check_options("beam_search", alpha=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: beam_search: alpha (the length-penalty exponent) must be a finite number >= 0 (0: plain log-probability), got nan.
    """
    if isinstance(max_extra, numbers.Real) and not max_extra >= 0:
        raise ValueError(f"{caller}: max_extra (output tokens allowed beyond the source length) must be >= 0, "
                         f"got {max_extra}.")
    if isinstance(alpha, numbers.Real) and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"{caller}: alpha (the length-penalty exponent) must be a finite number >= 0 "
                         f"(0: plain log-probability), got {alpha}.")


def _check_same_batch(caller, source, target):
    """Refuses a source and a target batch of different sizes where both sizes are known (Python ints)."""
    sources, targets = ops.shape(source)[0], ops.shape(target)[0]
    if isinstance(sources, int) and isinstance(targets, int) and sources != targets:
        raise ValueError(f"{caller}: {sources} source sentence(s) but {targets} target(s); "
                         "give one target per source.")


def ensemble_members(model):
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


def _member_step(model, source, pad_id, beams, steps, use_cache, cache_length):
    """One model's half of `_step_function`: `(step, cache)` returning the newest position's float32 logits."""
    memory, source_padding = encode(model, source, pad_id)  # (B, S, D), (B, S)
    decoder = parts(model).decoder

    if use_cache:
        # Cross-attention: N pairs (B, H, S, dk), (B, H, S, dv), one row per sentence shared by its K beams.
        # Self-attention: N pairs (B*K, H, T, dk), (B*K, H, T, dv), T = the first cache stage (grown later).
        cross = decoder.cross_attention_cache(memory)
        cache = decoder.initial_cache(ops.shape(source)[0] * beams, cache_length)
        kernel = output_kernel(model)  # (D, V), transposed once here rather than at every step

        def step(sequences, t, cache):
            token = ops.expand_dims(ops.take(sequences, t, axis=1), 1)  # (B*K, 1)
            logits, cache = decode(model, token, None, source_padding, self_attention_cache=cache,
                                   cache_index=t, cross_attention_cache=cross, beam_size=beams,
                                   output_kernel=kernel)
            return ops.cast(logits[:, 0], "float32"), cache
        return step, cache

    memory = ops.repeat(memory, beams, axis=0)  # (B*K, S, D)
    source_padding = ops.repeat(source_padding, beams, axis=0)  # (B*K, S)

    def uncached_step(sequences, t, cache):
        logits = decode(model, sequences[:, :steps], memory, source_padding)  # (B*K, T_max, V)
        return ops.cast(ops.take(logits, t, axis=1), "float32"), cache
    return uncached_step, ()


def _combine(log_probs):
    """Members' next-token log-probabilities -> the ensemble's: log of the mean probability."""
    if len(log_probs) == 1:
        return log_probs[0]
    return ops.logsumexp(ops.stack(log_probs), axis=0) - math.log(len(log_probs))


def _step_function(models, source, pad_id, beams, steps, use_cache, cache_length):
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
    """
    members = [_member_step(m, source, pad_id, beams, steps, use_cache, cache_length) for m in models]
    sizes = [len(cache) for _, cache in members]
    cache = tuple(pair for _, member_cache in members for pair in member_cache) if use_cache else ops.zeros((1,))

    def step(sequences, t, cache):
        outputs, updated, start = [], [], 0
        for (member, _), size in zip(members, sizes):
            logits, member_cache = member(sequences, t, cache[start:start + size] if use_cache else ())
            outputs.append(logits)
            updated.extend(member_cache)
            start += size
        cache = tuple(updated) if use_cache else cache
        if len(outputs) == 1:
            return outputs[0], ops.logsumexp(outputs[0], axis=-1, keepdims=True), cache
        combined = _combine([ops.log_softmax(logits, axis=-1) for logits in outputs])
        return combined, ops.zeros_like(combined[:, :1]), cache
    return step, cache


def _excluded(tokens, pad_id, bos_id):
    """True where a token id is one that is never produced (padding, bos)."""
    return ops.logical_or(ops.equal(tokens, pad_id), ops.equal(tokens, bos_id))


# The self-attention caches can grow in two stages: the search first runs a loop over caches of a
# few positions, and only if some sentence needs more steps pads them to the whole output buffer and
# goes on in a second loop. Writing a step's keys and values, reordering the beams and attending all
# cost in proportion to the cache length, and most outputs are short, so most steps then work on a
# short cache instead of the `source length + max_extra` buffer. The second loop's body is traced
# too, which a process pays once per search shape; `Translator` (and so every export) uses stages,
# the functions here only when asked (`first_cache_stage`).
FIRST_CACHE_STAGE = 32


def cache_stages(steps, first_cache_stage=None):
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
        raise ValueError(f"first_cache_stage must be a positive number of positions (or None), got {first_cache_stage}.")
    if isinstance(steps, int) and steps <= first:
        return [steps]
    return [first, steps]


def _grow(cache, length):
    """Pads every `(rows, H, T, d)` cache tensor to at least `length` positions (zeros, which attention masks out).

    With a static `length` the padding is a Python int (XLA and JAX need static shapes); a
    `length` known only at run time (TensorFlow graphs) gives caches of unknown length.
    """
    def padded(tensor):
        current = tensor.shape[2]
        if isinstance(length, int) and isinstance(current, int):
            extra = max(length - current, 0)
        else:
            extra = ops.maximum(length - ops.shape(tensor)[2], 0)
        return ops.pad(tensor, [[0, 0], [0, 0], [0, extra], [0, 0]])
    return tuple(tuple(padded(tensor) for tensor in pair) for pair in cache)


def _search_loop(cond, body, state, stages):
    """`while cond(state): state = body(state)`, one `while_loop` per cache length in `stages`.

    A loop runs while `cond` holds and the step `t` still fits its cache; the caches then grow to
    the next length. With one stage this is a single `while_loop`.
    """
    for index, length in enumerate(stages):
        if index:
            state = {**state, "cache": _grow(state["cache"], length)}

        def fits(state, length=length):
            return ops.logical_and(ops.less(state["t"], length), cond(state))
        state = ops.while_loop(fits, body, state)
    return state


# ----------------------------------------------------------------- decoding


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
    source = _token_ids("greedy_decode", "source", source, models[0])
    batch = ops.shape(source)[0]
    limits, steps = output_limits(models[0], source, pad_id, max_extra, max_length)  # (B,), T_max
    stages = cache_stages(steps, first_cache_stage) if use_cache else [steps]
    step, cache = _step_function(models, source, pad_id, 1, steps, use_cache, stages[0])

    sequences = _write_column(ops.full((batch, steps + 1), pad_id, dtype="int32"), 0,
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
        log_probs = ops.where(_excluded(vocab, pad_id, bos_id), NEG_INF, log_probs)  # (B, V)
        token = ops.cast(ops.argmax(log_probs, axis=-1), "int32")  # (B,)
        token = ops.where(finished, pad_id, token)
        gain = ops.take_along_axis(log_probs, ops.expand_dims(token, 1), axis=1)[:, 0]  # (B,)
        scores = state["scores"] + ops.where(finished, 0.0, gain)
        finished = finished | ops.equal(token, eos_id) | ops.greater_equal(t + 1, limits)
        return {"t": t + 1, "sequences": _write_column(state["sequences"], t + 1, token),
                "cache": cache, "scores": scores, "finished": finished}

    state = _search_loop(cond, body, state, stages)
    return state["sequences"][:, 1:], state["scores"]


def beam_search(model, source, beam_size=4, alpha=0.6, max_extra=50, max_length=None, num_return=1,
                pad_id=0, bos_id=2, eos_id=3, use_cache=True, first_cache_stage=None, early_exit=False,
                return_steps=False):
    """Beam search with the GNMT length penalty, batched, with a key/value cache.

    At every step each alive hypothesis is extended by every token and the
    best `2 * beam_size` candidates are kept. Those among the best
    `beam_size` that end (with eos, or at the sentence's length limit) join
    the finished list, scored log P / lp(length); the best `beam_size` that
    did not end stay alive. A sentence is done when no alive hypothesis can
    still beat its `num_return`-th finished one (log-probabilities only fall
    and lp grows with length, so alive_log_prob / lp(limit) bounds every
    future score); the loop stops when every sentence is done, so asking for
    fewer hypotheses can stop sooner but never changes the ones returned.
    With `beam_size=1` and `alpha=0` this is exactly greedy decoding.

    That rule is exact, and it is slow to fire: lp(limit) is several times
    lp(length) for a short sentence, so an alive hypothesis must fall far
    below the finished ones before the bound lets go. `early_exit` adds the
    rule OpenNMT and CTranslate2 stop on: a sentence is also done once the
    best of some step's candidates ended (its eos scored highest by log P)
    and `beam_size` hypotheses in all have ended. The finished list keeps the
    best by log P / lp(length) as before. On the shipped EN-DE model and the
    Multi30k validation split (one sentence at a time, beam 5, alpha 1) it ran
    15% fewer steps (15.5 instead of 18.2 per sentence), changed 10 of 1,014
    translations and BLEU by -0.03 (docs/decoding.md, "Early exit").

    Args:
        model: a `build_model` model, or a list of them to decode as an ensemble
            (`ensemble_members`; the mean of their next-token distributions).
        source: int `(B, S)` source ids (tokens then eos), padded with `pad_id`.
        beam_size: K, hypotheses kept per sentence (paper: 4).
        alpha: length-penalty exponent (paper: 0.6), finite and >= 0; 0 ranks by log-probability.
        max_extra: each sentence produces at most its source length + `max_extra` tokens (>= 0).
        max_length: optional absolute cap on output tokens.
        num_return: how many of the best hypotheses to return (n-best), <= beam_size.
        pad_id, bos_id, eos_id: the special ids.
        use_cache, first_cache_stage: as in `greedy_decode`.
        early_exit: also stop a sentence by the OpenNMT/CTranslate2 rule above.
        return_steps: also return how many decoder steps the search ran.

    Returns:
        `(tokens, scores)`: int32 `(B, num_return, T)` hypotheses, best first,
        ending with eos and padded with `pad_id`; float32 `(B, num_return)`
        scores log P(tokens | source) / lp(length), where length counts eos.
        With `return_steps`, `(tokens, scores, steps)`: steps is an int32
        scalar, the steps until every sentence was done (one sentence: its
        own; `bench/stopping_rules.py` counts them per sentence).

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tokens, scores = beam_search(model, np.array([[7, 8, 3]]), beam_size=3, num_return=2,
    ...                              max_extra=4)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 2, 7), (1, 2))
    """
    beams = int(beam_size)
    if beams < 1:
        raise ValueError(f"beam_search: beam_size must be >= 1, got {beam_size}.")
    if not 1 <= int(num_return) <= beams:
        raise ValueError(f"beam_search: num_return must be in [1, beam_size={beams}], got {num_return}.")
    check_options("beam_search", max_extra=max_extra, alpha=alpha)
    models = ensemble_members(model)
    source = _token_ids("beam_search", "source", source, models[0])
    batch = ops.shape(source)[0]
    limits, steps = output_limits(models[0], source, pad_id, max_extra, max_length)  # (B,), T_max
    best_possible_penalty = length_penalty(limits, alpha)  # (B,)
    stages = cache_stages(steps, first_cache_stage) if use_cache else [steps]
    step, cache = _step_function(models, source, pad_id, beams, steps, use_cache, stages[0])

    empty = ops.full((batch, beams, steps + 1), pad_id, dtype="int32")  # (B, K, T_max + 1)
    first_beam_only = ops.where(ops.arange(beams) == 0, 0.0, NEG_INF)  # only beam 0 is live at t = 0
    state = {
        "t": ops.convert_to_tensor(0, "int32"),
        "alive": _write_column(empty, 0, ops.full((batch, beams), bos_id, dtype="int32")),
        "alive_log_probs": ops.tile(ops.expand_dims(ops.cast(first_beam_only, "float32"), 0), (batch, 1)),
        "finished": empty,
        "finished_scores": ops.full((batch, beams), NEG_INF, dtype="float32"),
        "done": ops.zeros((batch,), "bool"),
        "cache": cache,
    }
    if early_exit:
        state["best_ended"] = ops.zeros((batch,), "bool")  # some step's best candidate ended
        state["ended"] = ops.zeros((batch,), "int32")  # hypotheses that ended so far
    top_k_rank = ops.arange(2 * beams) < beams  # (2K,): candidates inside the beam proper
    returned = int(num_return) - 1  # the last returned finished hypothesis decides when a sentence is done

    def cond(state):
        return ops.logical_and(ops.less(state["t"], steps), ops.logical_not(ops.all(state["done"])))

    def body(state):
        t = state["t"]
        length = t + 1  # tokens in every hypothesis after this step, eos included

        # Extend every alive hypothesis by every token and keep the best 2K candidates. They are
        # among each hypothesis's own best 2K tokens other than pad and bos, so each row keeps its
        # best 2K + 2 tokens first (ties: the lower id, as a top_k over all K*V candidates would).
        flat_alive = ops.reshape(state["alive"], (batch * beams, steps + 1))
        values, normalizer, cache = step(flat_alive, t, state["cache"])  # (B*K, V), (B*K, 1)
        per_row = min(2 * beams + 2, int(values.shape[-1]))
        row_values, row_tokens = top_k_by_blocks(values, per_row)  # (B*K, k)
        row_log_probs = ops.where(_excluded(row_tokens, pad_id, bos_id), NEG_INF, row_values - normalizer)
        candidates = ops.expand_dims(state["alive_log_probs"], 2) + ops.reshape(row_log_probs,
                                                                                 (batch, beams, per_row))
        top_log_probs, top_index = ops.top_k(ops.reshape(candidates, (batch, beams * per_row)), 2 * beams)
        top_beam = ops.cast(top_index // per_row, "int32")  # (B, 2K) which hypothesis it extends
        top_token = ops.take_along_axis(ops.reshape(ops.cast(row_tokens, "int32"), (batch, beams * per_row)),
                                        top_index, axis=1)  # (B, 2K) with which token
        top_sequences = _write_column(_gather_beams(state["alive"], top_beam), length, top_token)

        at_limit = ops.expand_dims(ops.greater_equal(length, limits), 1)  # (B, 1)
        is_eos = ops.equal(top_token, eos_id)

        # Alive: the best K candidates that go on (no eos, room left).
        goes_on = ops.logical_not(is_eos | at_limit)
        alive_log_probs, alive_pick = ops.top_k(ops.where(goes_on, top_log_probs, NEG_INF), beams)
        alive = _gather_beams(top_sequences, alive_pick)  # (B, K, T_max + 1)
        parent = ops.take_along_axis(top_beam, alive_pick, axis=1)  # (B, K)
        if use_cache:
            rows = _flat_index(parent, beams)  # reorder every layer's cache rows
            cache = tuple(tuple(ops.take(tensor, rows, axis=0) for tensor in pair) for pair in cache)

        # Finished: candidates inside the beam proper that end, merged with those found before.
        ends = (is_eos | at_limit) & top_k_rank
        new_scores = ops.where(ends, top_log_probs / length_penalty(length, alpha), NEG_INF)
        if early_exit:  # a sentence done by that rule keeps its list while the batch's others go on
            new_scores = ops.where(ops.expand_dims(state["done"], 1), NEG_INF, new_scores)
        finished_scores, pick = ops.top_k(ops.concatenate([state["finished_scores"], new_scores], 1), beams)
        finished = _gather_beams(ops.concatenate([state["finished"], top_sequences], 1), pick)

        # Done when the best alive hypothesis cannot beat the last returned finished one any more.
        best_alive_bound = alive_log_probs[:, 0] / best_possible_penalty  # (B,)
        done = ops.greater_equal(finished_scores[:, returned], best_alive_bound)
        updated = {"t": length, "alive": alive, "alive_log_probs": alive_log_probs, "finished": finished,
                   "finished_scores": finished_scores, "done": done, "cache": cache}
        if early_exit:  # or when a step's best candidate ended and beam_size hypotheses have ended
            best_ended = ops.logical_or(state["best_ended"], ends[:, 0])
            ended = state["ended"] + ops.sum(ops.cast(ends, "int32"), axis=1)
            updated.update(best_ended=best_ended, ended=ended,
                           done=ops.logical_or(done, ops.logical_and(best_ended, ended >= beams)))
        return updated

    state = _search_loop(cond, body, state, stages)
    scores = state["finished_scores"][:, :num_return]  # (B, R)
    tokens = state["finished"][:, :num_return, 1:]  # (B, R, T_max)
    # A slot that never received a hypothesis (tiny vocabularies only) comes back as all padding.
    tokens = ops.where(ops.expand_dims(ops.isfinite(scores), 2), tokens, pad_id)
    if return_steps:
        return tokens, scores, state["t"]
    return tokens, scores


def score(model, source, target, alpha=0.0, pad_id=0, bos_id=2):
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
    source = _token_ids("score", "source", source, first)
    target = _token_ids("score", "target", target, first, embedding="target")
    _check_same_batch("score", source, target)
    check_options("score", alpha=alpha)
    bos = ops.full((ops.shape(target)[0], 1), bos_id, dtype="int32")
    decoder_input = ops.concatenate([bos, target[:, :-1]], axis=1)  # (B, T), shifted right
    members = []
    for member in ensemble_members(model):
        memory, source_padding = encode(member, source, pad_id)
        logits = decode(member, decoder_input, memory, source_padding)  # (B, T, V)
        members.append(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
    log_probs = _combine(members)
    token_log_probs = ops.take_along_axis(log_probs, ops.expand_dims(target, -1), axis=-1)[..., 0]  # (B, T)
    real = ops.not_equal(target, pad_id)
    total = ops.sum(ops.where(real, token_log_probs, 0.0), axis=1)
    return total / length_penalty(ops.sum(ops.cast(real, "int32"), axis=1), alpha)


__all__ = ["beam_search", "ensemble_members", "greedy_decode", "length_penalty", "max_positions", "output_limits", "score"]
