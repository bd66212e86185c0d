"""Sampling: each next token drawn from the model's distribution, reshaped by temperature, top-k and top-p.

At every step a row's log-probabilities (pad and bos excluded) are divided by
the temperature and ranked, descending (ties: the lower id first); the ranks
past `top_k` and past the nucleus (the smallest prefix whose probability
reaches `top_p`; the most probable token always stays) are dropped, and one
uniform number picks a token among the rest by inverse CDF. In a traced
search (`tf.function`, XLA, JAX) nothing is sorted: each cut's last token and
the drawn one are located by bisection on the values' order, a few dozen
masked sums over the vocabulary (XLA's CPU sort compares every pair it
moves). Run eagerly on TensorFlow, one top-k kernel sorts the row faster than
the bisection's loops run op by op. The four settings may be Python numbers or
scalar tensors (a SavedModel takes them as inputs), and every shape is
static.

The uniform numbers come from a counter-based hash of `(seed, row key, sample,
step)` in 32-bit integer `keras.ops` (the "lowbias32" finalizer), not from
`keras.random`, whose streams differ between backends and under XLA. A row's
key is by default a hash of its sentence's ids (`source_keys`). So a
sentence's samples depend on the seed and the sentence only, never on the
batch, its order, padding or chunking, and the numbers drawn are bit-identical
eagerly, in `tf.function`, under XLA and on JAX.
"""

from collections.abc import Callable
from typing import Any

import numpy as np
from keras import ops

from keras_transformer.decoding.constraints import Bans, banned_ids
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.search import ensemble_members, one_token_search, token_ids
from keras_transformer.decoding.strategies import MAX_SEED, Sampling, is_integer  # MAX_SEED: 32-bit seeds and keys
from keras_transformer.errors import ConfigError
from keras_transformer.runtime.keras_internals import tensorflow_runs_eagerly

# lowbias32 (Chris Wellons' hash-prospector): x ^= x >> 16; x *= M1; x ^= x >> 15; x *= M2; x ^= x >> 16.
# The multipliers as int32 (two's complement): int32 products wrap around alike in TensorFlow, XLA and JAX.
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - 2**32
_GOLDEN = 0x9E3779B9 - 2**32  # added to the seed, so that seed 0 does not start from hash(0) = 0


def _shift_right(x: Any, bits: int) -> Any:
    """Logical right shift of int32 `x` (backends shift signed integers arithmetically: the sign bits are masked)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _mix(x: Any) -> Any:
    """lowbias32: a bijection of 32-bit integers whose every output bit depends on every input bit."""
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, ops.convert_to_tensor(np.int32(_M1)))
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, ops.convert_to_tensor(np.int32(_M2)))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def _streams(seed: Any, row_keys: Any, sample: Any) -> Any:
    """The hash state of each row's stream of draws: `(seed, row key, sample)` mixed, int32 of `row_keys`' shape."""
    state = _mix(ops.add(ops.cast(seed, "int32"), ops.convert_to_tensor(np.int32(_GOLDEN))))
    state = _mix(ops.bitwise_xor(state, ops.cast(row_keys, "int32")))
    return _mix(ops.bitwise_xor(state, ops.cast(sample, "int32")))


def _uniform(streams: Any, step: Any) -> Any:
    """The draw of every stream at `step`: float32 in [0, 1), a multiple of 2**-24 (the hash's top 24 bits)."""
    bits = _mix(ops.bitwise_xor(streams, ops.cast(step, "int32")))
    return ops.cast(_shift_right(bits, 8), "float32") * (1.0 / 2**24)


def uniform(seed: Any, row_keys: Any, sample: Any, step: Any) -> Any:
    """The uniform number that draws the token of sample `sample` of the sentence `row_keys` at `step`.

    A function of its four integer arguments only (they broadcast against each other), the same on every
    backend and under XLA: `sample` uses it, and tests check it against a numpy copy of the hash.

    Args:
        seed: int in [0, 2**31), or an integer tensor.
        row_keys: int `(...)`, the sentences' keys (`sample`'s `row_keys`).
        sample: int, which of a sentence's samples (0 .. num_return - 1).
        step: int, the output position (0: the first token).

    Returns:
        float32 in [0, 1), multiples of 2**-24.

    Example:

    >>> import numpy as np
    >>> draws = uniform(7, np.arange(4), 0, 0).numpy()
    >>> draws.shape, bool(np.all((draws >= 0) & (draws < 1))), len(set(draws.tolist()))
    ((4,), True, 4)
    >>> float(uniform(7, 2, 0, 0)) == float(draws[2])
    True
    """
    return _uniform(_streams(seed, row_keys, sample), step)


def _check_settings(top_k: Any, top_p: Any, temperature: Any, seed: Any, num_return: Any) -> None:
    """Refuses bad Python (and numpy) settings by name, as `DecodeOptions` does (`strategies.Sampling`); tensors
    are taken as they are (see `choose_tokens`)."""
    Sampling.check_settings({"top_k": top_k, "top_p": top_p, "temperature": temperature, "seed": seed},
                            where="sample: ")
    if not (is_integer(num_return) and num_return >= 1):
        raise ValueError(f"sample: num_return (samples per sentence) must be an integer >= 1, got {num_return!r}.")


def source_keys(source: Any, pad_id: int = 0) -> Any:
    """int32 `(B,)`: each sentence's key, a hash of its source ids and their positions (padding left out).

    The default row keys of `sample`: a sentence's draws then depend on the seed and the sentence itself,
    not on where it stands in a request or how a translator sorted, chunked or padded it; the same
    sentence twice gets the same samples (ask for `num_return` of them for several).

    Example:

    >>> import numpy as np
    >>> keys = source_keys(np.array([[7, 8, 3, 0], [7, 8, 3, 0], [8, 7, 3, 0]])).numpy()
    >>> bool(keys[0] == keys[1]), bool(keys[0] == keys[2])
    (True, False)
    >>> bool(source_keys(np.array([[7, 8, 3]])).numpy()[0] == keys[0])  # padding changes nothing
    True
    """
    ids = ops.cast(ops.convert_to_tensor(source), "int32")  # (B, S)
    positions = ops.expand_dims(ops.arange(ops.shape(ids)[1], dtype="int32"), 0)  # (1, S)
    terms = _mix(ops.bitwise_xor(_mix(ids), positions))  # (B, S)
    summed = ops.sum(ops.where(ops.not_equal(ids, pad_id), terms, 0), axis=1)  # wraps around alike everywhere
    return ops.bitwise_and(_mix(summed), MAX_SEED)


def _row_keys(row_keys: Any, batch: Any) -> Any:
    """`row_keys` as int32 `(B,)`, checked where concrete."""
    if isinstance(row_keys, (list, tuple, np.ndarray)):
        keys = np.asarray(row_keys)
        if keys.ndim != 1 or (isinstance(batch, int) and keys.shape[0] != batch):
            raise ValueError(f"sample: row_keys must be one integer per source sentence, shape ({batch},), "
                             f"got shape {keys.shape}.")
        if keys.size and (not np.issubdtype(keys.dtype, np.integer) or keys.min() < 0 or keys.max() > MAX_SEED):
            raise ValueError(f"sample: row_keys must be integers in [0, {MAX_SEED}], got {keys.tolist()[:8]}.")
    return ops.cast(ops.convert_to_tensor(row_keys), "int32")


_INT32_MIN = np.int32(-(2**31))
_INT32_MAX = np.int32(2**31 - 1)


def _order_keys(values: Any) -> Any:
    """int32 keys in the order of float32 `values` (-0.0 counted as 0.0; -inf below every finite value)."""
    values = ops.where(ops.equal(values, 0.0), ops.zeros_like(values), values)
    bits = ops.view(values, "int32")  # a negative float's bits grow with its magnitude: flip them
    return ops.where(ops.less(bits, 0), ops.bitwise_xor(bits, _INT32_MAX), bits)


def _up_to(keys: Any, ids: Any, key: Any, index: Any) -> Any:
    """Whether each element comes at or before the element `(key, index)` in the order: keys descending,
    ties by the lower id."""
    return ops.logical_or(ops.greater(keys, key), ops.logical_and(ops.equal(keys, key), ops.less_equal(ids, index)))


def _first_reaching(keys: Any, ids: Any, weights: Any, target: Any, strictly: bool, id_bits: int) -> tuple[Any, Any]:
    """`(key, id)`, int32 `(N, 1)` each: of each row's elements in the order (keys descending, ties by the lower
    id), the first whose cumulative weight, its own included, is above `target` (`strictly`) or at least it.

    Without a sort: the largest key whose elements of that key or above reach the target is built bit by bit
    from the top (a loop of 32 masked sums), then the id within that key the same way (`id_bits` of them); every sum
    is one masked sum over the row, so a larger set never sums to less. A row that nothing reaches gives the key
    -2**31 and an id past the vocabulary (`_up_to` of it is every element).
    """
    def reaches(mass: Any) -> Any:
        return ops.greater(mass, target) if strictly else ops.greater_equal(mass, target)

    def mass(mask: Any) -> Any:
        return ops.sum(ops.where(mask, weights, 0.0), axis=-1, keepdims=True)

    rows = ops.shape(keys)[0]

    def key_bit(i: Any, found: Any) -> Any:  # bit 31 - i of the key's offset from -2**31, in int32 bits
        candidate = ops.bitwise_or(found, ops.left_shift(np.int32(1), 31 - i))
        reached = reaches(mass(ops.greater_equal(keys, ops.bitwise_xor(candidate, _INT32_MIN))))
        return ops.where(reached, candidate, found)

    key = ops.bitwise_xor(ops.fori_loop(0, 32, key_bit, ops.zeros((rows, 1), "int32")), _INT32_MIN)
    ahead, tied = ops.greater(keys, key), ops.equal(keys, key)

    def id_bit(i: Any, index: Any) -> Any:  # the largest id whose tied elements before it do not reach yet
        candidate = ops.bitwise_or(index, ops.left_shift(np.int32(1), id_bits - 1 - i))
        reached = reaches(mass(ops.logical_or(ahead, ops.logical_and(tied, ops.less(ids, candidate)))))
        return ops.where(reached, index, candidate)

    index = ops.fori_loop(0, id_bits, id_bit, ops.zeros((rows, 1), "int32"))
    return key, index


def choose_tokens(log_probs: Any, u: Any, top_k: Any, top_p: Any, temperature: Any, sort: bool = False) -> Any:
    """The sampled token of every row: `log_probs (N, V)` (excluded ids -inf), `u (N,)` uniform -> int32 `(N,)`.

    The token the module's docstring describes (the inverse CDF over the tokens in descending order, after the
    cuts). By default found without sorting the vocabulary: each cut's last token and the drawn one are located by
    bisection on the values' order (`_first_reaching`), about 50 masked sums over the vocabulary each, where a
    sort compares every pair it moves (the faster way traced, several times faster under XLA). With `sort`, the
    row is sorted and cut by rank (`_choose_by_sort`; the faster way eagerly). The two differ only where float
    rounding of the cumulative mass puts a boundary on the other side of a draw. The settings are Python numbers
    or scalar tensors. Settings out of range act as their nearest sensible value, so that a tensor input cannot
    break the search: a temperature <= 0 as greedy, top_k < 0 as 0 (no cut), top_p <= 0 keeps the first token
    only.

    Example:

    >>> import numpy as np
    >>> log_probs = np.log(np.array([[0.1, 0.5, 0.3, 0.1]], "float32"))  # in order: ids 1, 2, then 0 and 3 tied
    >>> [int(choose_tokens(log_probs, np.array([u], "float32"), 0, 1.0, 1.0)[0]) for u in (0.0, 0.55, 0.85, 0.95)]
    [1, 2, 0, 3]
    >>> [int(choose_tokens(log_probs, np.array([0.95], "float32"), k, p, 1.0)[0]) for k, p in ((2, 1.0), (0, 0.5))]
    [2, 1]
    >>> [int(choose_tokens(log_probs, np.array([u], "float32"), 0, 1.0, 1.0, sort=True)[0]) for u in (0.55, 0.95)]
    [2, 3]
    """
    if sort:
        return _choose_by_sort(log_probs, u, top_k, top_p, temperature)
    vocab = int(log_probs.shape[-1])
    id_bits = max(1, vocab.bit_length())  # 2**id_bits > every id
    temperature = ops.maximum(ops.cast(temperature, "float32"), 1e-6)
    values = log_probs / temperature
    keys = _order_keys(values)  # (N, V)
    ids = ops.expand_dims(ops.arange(vocab, dtype="int32"), 0)  # (1, V)
    probs = ops.exp(values - ops.max(values, axis=-1, keepdims=True))  # (N, V) unnormalised, the first is 1
    top_key = ops.max(keys, axis=-1, keepdims=True)
    top_id = ops.min(ops.where(ops.equal(keys, top_key), ids, vocab), axis=-1, keepdims=True)
    first = ops.logical_and(ops.equal(keys, top_key), ops.equal(ids, top_id))  # always kept

    def cut(weights: Any, target: Any) -> Any:  # the elements up to the first whose cumulative weight reaches target
        return _up_to(keys, ids, *_first_reaching(keys, ids, weights, target, False, id_bits))

    everything = ops.ones_like(first)

    def top_k_cut() -> Any:  # the top_k first tokens (`_when` calls it only for top_k > 0)
        return cut(ops.ones_like(probs), ops.cast(top_k, "float32"))

    def nucleus() -> Any:  # up to the first token whose cumulative mass reaches top_p of the whole
        mass = ops.cast(top_p, "float32") * ops.sum(probs, axis=-1, keepdims=True)
        return cut(probs, mass)

    kept = ops.logical_and(_when(top_k, lambda k: k > 0, top_k_cut, everything),
                           _when(top_p, lambda p: p < 1.0, nucleus, everything))
    kept_probs = ops.where(ops.logical_or(kept, first), probs, 0.0)  # (N, V)

    # Inverse CDF: the first token whose cumulative kept mass exceeds u * (the kept mass); where float rounding
    # of u * mass reaches the whole mass, the last token of positive kept mass.
    target = ops.expand_dims(u, 1) * ops.sum(kept_probs, axis=-1, keepdims=True)  # (N, 1)
    key, index = _first_reaching(keys, ids, kept_probs, target, True, id_bits)
    positive = ops.greater(kept_probs, 0.0)
    last_key = ops.min(ops.where(positive, keys, _INT32_MAX), axis=-1, keepdims=True)
    last_id = ops.max(ops.where(ops.logical_and(positive, ops.equal(keys, last_key)), ids, -1), axis=-1,
                      keepdims=True)
    return ops.where(_up_to(key, index, last_key, last_id), index, last_id)[:, 0]


def _choose_by_sort(log_probs: Any, u: Any, top_k: Any, top_p: Any, temperature: Any) -> Any:
    """`choose_tokens` with the row sorted: a descending `top_k` of the whole vocabulary (ties: the lower id
    first), the cuts by rank, then the inverse CDF over running sums, summed in float64 (float32 running sums
    over thousands of ranks drift by more than a tail token's mass)."""
    vocab = int(log_probs.shape[-1])
    temperature = ops.maximum(ops.cast(temperature, "float32"), 1e-6)
    values, ids = ops.top_k(log_probs / temperature, vocab)  # (N, V)
    probs = ops.cast(ops.exp(values - values[:, :1]), "float64")  # (N, V) unnormalised, the first is 1
    total = ops.sum(probs, axis=-1, keepdims=True)  # (N, 1)
    cumulative = ops.cumsum(probs, axis=-1)
    before = ops.concatenate([ops.zeros_like(probs[:, :1]), cumulative[:, :-1]], axis=-1)  # mass of higher ranks
    rank = ops.arange(vocab, dtype="int32")  # (V,)
    top_k = ops.cast(top_k, "int32")
    top_p = ops.cast(top_p, "float64")
    in_top_k = ops.logical_or(ops.less(rank, top_k), ops.less_equal(top_k, 0))  # (V,)
    in_nucleus = ops.logical_or(ops.less(before, top_p * total), ops.greater_equal(top_p, 1.0))  # (N, V)
    kept_probs = ops.where(ops.logical_or(ops.logical_and(in_top_k, in_nucleus), ops.equal(rank, 0)), probs, 0.0)

    # Inverse CDF: the first rank whose cumulative kept mass exceeds u * (the kept mass), or where float rounding
    # of u * mass reaches the whole mass, the last rank of positive kept mass.
    kept_cumulative = ops.cumsum(kept_probs, axis=-1)
    target = ops.expand_dims(ops.cast(u, "float64"), 1) * kept_cumulative[:, -1:]  # (N, 1)
    chosen = ops.sum(ops.cast(ops.less_equal(kept_cumulative, target), "int32"), axis=-1)  # (N,)
    last = ops.sum(ops.cast(ops.greater(kept_probs, 0.0), "int32"), axis=-1) - 1
    chosen = ops.minimum(chosen, last)
    return ops.take_along_axis(ops.cast(ids, "int32"), ops.expand_dims(chosen, 1), axis=1)[:, 0]


def _when(setting: Any, applies: Callable[[Any], Any], compute: Callable[[], Any], otherwise: Any) -> Any:
    """`compute()` where `applies(setting)` holds, else `otherwise`: decided in Python for a Python (or numpy)
    number, by `ops.cond` for a tensor (a SavedModel's input; compared as float32), so that a cut left off costs
    nothing."""
    if isinstance(setting, (int, float, np.number)):
        return compute() if applies(float(setting)) else otherwise
    return ops.cond(applies(ops.cast(setting, "float32")), compute, lambda: otherwise)


def sample(model: Any, source: Any, top_k: Any = 0, top_p: Any = 1.0, temperature: Any = 1.0, seed: Any = 0,
           row_keys: Any = None, num_return: int = 1, max_extra: int = 50, max_length: int | None = None,
           pad_id: int = 0, bos_id: int = 2, eos_id: int = 3, use_cache: bool = True,
           first_cache_stage: int | None = None, target_prefix: Any = None, constraints: Any = None,
           banned: Any = None, start_from_prefix: bool = False) -> tuple[Any, Any]:
    """Decodes a batch by drawing every next token from the model's (reshaped) distribution.

    Each step divides the log-probabilities by `temperature`, keeps the `top_k` most probable tokens and the
    nucleus of probability `top_p`, and draws among them in proportion to their (tempered) probability.
    Pad and bos are never drawn. The draw of sample `r` of a sentence at step `t` depends only on
    `(seed, row key, r, t)`: a sentence gets the same samples alone or in any batch, padded or not, eagerly,
    in `tf.function`, under XLA and on JAX (the numbers drawn are bit-identical; a token could differ only where
    the backends' float rounding of the probabilities moves a boundary across a draw).

    Args:
        model: a `build_model` model, or a list of them to decode as an ensemble
            (`ensemble_members`; the mean of their next-token distributions).
        source: int `(B, S)` source ids (tokens then eos), padded with `pad_id`.
        top_k: draw among the k most probable tokens only; 0: no cut. An int >= 0 or an int scalar tensor.
        top_p: draw within the smallest set of most probable tokens whose probability reaches top_p (the
            nucleus, computed after the temperature; the most probable token is always in it); 1: no cut.
            In (0, 1], or a float scalar tensor.
        temperature: the logits are divided by this (> 0): below 1 sharper (toward greedy), above 1 flatter.
            A float or a float scalar tensor.
        seed: the draws' seed, in [0, 2**31), or an int scalar tensor.
        row_keys: int `(B,)` a key per sentence (its draws' stream); default `source_keys(source)`, a hash of
            the sentence's ids, so that a sentence's samples do not depend on its batch or its place in it.
        num_return: samples per sentence (independent draws), a Python int >= 1.
        max_extra, max_length, pad_id, bos_id, eos_id, use_cache, first_cache_stage, target_prefix,
            start_from_prefix: as in
            `greedy_decode` (every sample of a sentence starts with its prefix; the draws of the forced steps
            are made and not used, so the steps after a prefix draw as they would at those positions).
        constraints: refused (`ConfigError`): a sample cannot be made to contain given phrases; decode with beam
            search or greedy decoding for that.
        banned: optional phrases no sample may contain, as in `beam_search`: a banned phrase's last token is
            never drawn after the rest of it.

    Returns:
        `(tokens, scores)`: int32 `(B, num_return, T)` samples ending with eos (unless cut by the length limit),
        padded with `pad_id`; float32 `(B, num_return)` log P(tokens | source) under the model's own
        distribution (untempered, uncut, no length penalty; a prefix's tokens included): what
        `score(..., alpha=0)` gives them.

    Example:

    >>> import keras
    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> keras.utils.set_random_seed(0)  # one random model every run: padding moves a logit's last bits, and a
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))  # draw on a boundary can flip
    >>> source = np.array([[7, 8, 3], [9, 3, 0]])
    >>> tokens, scores = sample(model, source, top_p=0.9, seed=1, num_return=2, max_extra=4)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((2, 2, 7), (2, 2))
    >>> again, _ = sample(model, source[1:, :2], top_p=0.9, seed=1, num_return=2, max_extra=4)  # alone, unpadded
    >>> bool(np.array_equal(again[0], tokens[1, :, :again.shape[-1]]))
    True
    """
    _check_settings(top_k, top_p, temperature, seed, num_return)
    if constraints is not None:
        raise ConfigError("sample: constraints (phrases every output must contain) need strategy 'beam' or "
                          "'greedy'; sampling honours banned phrases only.")
    bans = None
    if banned is not None:
        checked = token_ids("sample", "source", source, ensemble_members(model)[0])
        bans = Bans(banned_ids("sample", banned, checked, ensemble_members(model)[0], pad_id, bos_id, eos_id), pad_id)
    rows = int(num_return)
    batch = ops.shape(source)[0] if hasattr(source, "shape") else len(source)
    keys = source_keys(source, pad_id) if row_keys is None else _row_keys(row_keys, batch)  # (B,)
    row = ops.arange(ops.shape(keys)[0] * rows, dtype="int32")  # (B*R,): row b * R + r
    streams = _streams(seed, ops.take(keys, row // rows), row % rows)  # (B*R,)

    sort = tensorflow_runs_eagerly()  # op by op, TensorFlow's top-k kernel beats the bisection's loops

    def draw(log_probs: Any, t: Any) -> Any:  # (B*R, V) -> (B*R,)
        return choose_tokens(log_probs, _uniform(streams, t), top_k, top_p, temperature, sort=sort)

    return one_token_search(model, source, draw, rows, max_extra, max_length, pad_id, bos_id, eos_id,
                            use_cache, first_cache_stage, caller="sample", target_prefix=target_prefix, bans=bans,
                            start_from_prefix=start_from_prefix)


def decode(models: Any, source: Any, options: DecodeOptions, pad_id: int, bos_id: int, eos_id: int,
           first_cache_stage: int | None = None, row_keys: Any = None, target_prefix: Any = None,
           constraints: Any = None, banned: Any = None, start_from_prefix: bool = False) -> tuple[Any, Any]:
    """The strategy's search (`strategies.Sampling`): `sample` with `options` (and
    `target_prefix`, `constraints`, refused, and `banned`, as there).

    Returns `options.returned()` independent samples per sentence: int32 `(B, R, T)` and float32 `(B, R)`
    scores log P(tokens | source) (no length penalty). `row_keys` as in `sample`.

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> from keras_transformer.decoding import DecodeOptions
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> options = DecodeOptions(strategy="sample", top_k=10, n_best=3, seed=5, max_extra=3)
    >>> tokens, scores = decode([model], np.array([[7, 8, 3]]), options, pad_id=0, bos_id=2, eos_id=3)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 3, 6), (1, 3))
    """
    return sample(models, source, top_k=options.top_k, top_p=options.top_p, temperature=options.temperature,
                  seed=options.seed, row_keys=row_keys, num_return=options.returned(), max_extra=options.max_extra,
                  pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, first_cache_stage=first_cache_stage,
                  target_prefix=target_prefix, constraints=constraints, banned=banned,
                  start_from_prefix=start_from_prefix)
