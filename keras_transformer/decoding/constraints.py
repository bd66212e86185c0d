"""Lexical constraints: phrases every output must contain (positive), and phrases none may contain (banned).

A phrase is one or more target token ids that must appear (or must not) as a contiguous run.

**Positive constraints** are given per sentence as int `(B, C, L)` (C phrases of up to L ids, padded with
`pad_id`), or `(B, C, F, L)` where each constraint has F alternative forms (any one satisfies it: "Vertrag" or
"Vertrags"); `pad_constraints` builds either from lists. Beam search meets them by dynamic beam allocation (Post &
Vilar, 2018) in the vectorized form of Hu et al. (2019): at every step each hypothesis is extended by its own best
tokens and, for every unmet constraint, by the next token of that constraint (the one after the longest prefix of
it that the hypothesis ends with, or its first). Every candidate is placed in a bank: the tokens of the
constraints it has met (a constraint counts its longest form) plus its furthest progress in one unmet
constraint, as fairseq's `LexicallyConstrainedBeamSearch` counts; the beam is filled round-robin across the
banks, the fullest first, each bank in score order. Eos is allowed only once every constraint is met.

Everything is fixed-shape `keras.ops`: a hypothesis's state is one flag per phrase (met), and its progress in
each phrase is read again at every step from its last L tokens, which is exactly the automaton of the papers (a
partial match that diverges falls back to the longest prefix of the phrase that the output still ends with, so a
prefix that re-occurs is not lost). Per step it costs a few `(B, K, 2K + 2 + P, P, L + 1, L)` comparisons and one
`(B, X, X)` ranking of the X candidates of a sentence, no loop over hypotheses. A sentence's search depends on
its own constraints only (batch-invariant).

What is guaranteed: the best bank's first candidate always stays in the beam, and extending it by the next
token of its furthest constraint raises its bank by one, so after n steps some hypothesis has a bank of at least
n. Constraints whose lengths (longest forms) add up to at most the tokens a sentence may produce are therefore
all met by a returned hypothesis, which comes first (unless a banned phrase or a forced prefix rules one out).
The constraints that cannot fit in a sentence's length limit (with its target prefix; shortest forms counted)
are left out, the shortest kept first: a sentence whose one constraint is too long gets its unconstrained
translation. A hypothesis ended by the limit with a constraint unmet is returned after those that meet all, so
an output is never empty; `constraints_met` says, per returned hypothesis, which constraints it contains. A
constraint given twice must appear twice (a phrase completes only one of its identical copies at a time).

**Banned phrases** `(B, Q, L)` (or `(Q, L)` for every sentence): whenever a hypothesis ends with all but the last
token of a banned phrase, that last token gets probability zero; a one-token phrase is never produced. Every
strategy honours them (the tokens of a target prefix are forced all the same).

Example:

>>> pad_constraints([[[5, 6], [7]], [[[8], [9, 10]]]]).shape  # sentence 1: one constraint of two forms
(2, 2, 2, 2)
>>> constraints = pad_constraints([[[5, 6], [7]], [[[8], [9, 10]]]])
>>> met = constraints_met(np.array([[[5, 6, 4, 3]], [[9, 10, 3, 0]]]), constraints)
>>> np.asarray(met).tolist()  # (B, R, C): sentence 0 lacks [7]; sentence 1 has the form [9, 10] (its slot 2: none)
[[[True, False]], [[True, True]]]
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
from keras import ops

from keras_transformer.decoding.search import NEG_INF
from keras_transformer.model import parts

SENTINEL = -1  # stands for the positions before the first output token: it matches no phrase token


def pad_constraints(rows: Sequence[Sequence[Any]], pad_id: int = 0, forms: bool = False) -> np.ndarray:
    """Per-sentence lists of phrases -> a padded int32 numpy array for `beam_search(constraints=...)`.

    Args:
        rows: one list per sentence; each item a phrase (a list of ids) or, for a constraint with alternative
            forms, a list of phrases (any one satisfies it).
        pad_id: the padding id.
        forms: always return `(B, C, F, L)` (else `(B, C, L)` when no constraint has several forms).

    Returns:
        int32 `(B, C, L)` or `(B, C, F, L)`, at least one column and one constraint wide (padding only: none).

    Example:

    >>> pad_constraints([[[5, 6, 7]], []]).tolist()
    [[[5, 6, 7]], [[0, 0, 0]]]
    >>> pad_constraints([[[[5], [6, 7]]]]).tolist()  # one constraint, two forms
    [[[[5, 0], [6, 7]]]]
    """
    def as_forms(item: Any) -> list[list[int]]:
        item = list(item)
        if item and all(isinstance(x, (list, tuple, np.ndarray)) for x in item):
            return [[int(i) for i in form] for form in item]
        return [[int(i) for i in item]]

    parsed = [[as_forms(item) for item in row] for row in rows]
    count = max([len(row) for row in parsed] + [1])
    width = max([len(form) for row in parsed for item in row for form in item] + [1])
    alternatives = max([len(item) for row in parsed for item in row] + [1])
    array = np.full((len(parsed), count, alternatives, width), pad_id, "int32")
    for b, row in enumerate(parsed):
        for c, item in enumerate(row):
            for f, form in enumerate(item):
                array[b, c, f, :len(form)] = form
    return array if forms or alternatives > 1 else array[:, :, 0]


def _check_phrases(caller: str, name: str, array: np.ndarray, batch: Any, vocab: int | None, pad_id: int,
                   bos_id: int, eos_id: int) -> None:
    """Refuses concrete phrase ids that are not integers in the vocabulary, hold bos or eos, or pad in between."""
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{caller}: {name} must hold integer token ids, got dtype {array.dtype}.")
    if isinstance(batch, int) and array.shape[0] != batch:
        raise ValueError(f"{caller}: {batch} source sentence(s) but {array.shape[0]} rows of {name}; "
                         f"give one row (possibly of padding only) per source.")
    if not array.size:
        return
    if vocab is not None and (array.min() < 0 or array.max() >= vocab):
        raise ValueError(f"{caller}: {name} ids must be in [0, {vocab}) (the model's vocabulary), "
                         f"got values from {array.min()} to {array.max()}.")
    for special, what in ((bos_id, "bos"), (eos_id, "eos")):
        if special != pad_id and np.any(array == special):
            raise ValueError(f"{caller}: {name} hold {what} ({special}); a phrase is ordinary target tokens.")
    real = array != pad_id
    if np.any(real[..., 1:] & ~real[..., :-1]):
        raise ValueError(f"{caller}: a phrase of {name} has a token after padding ({pad_id}); give each phrase's "
                         "tokens first, then padding.")


def _vocab_size(model: Any) -> int | None:
    if model is None:
        return None
    return parts(model).target_embedding.vocab_size


def _as_tensor(caller: str, name: str, value: Any, ranks: tuple[int, ...], batch: Any, model: Any, pad_id: int,
               bos_id: int, eos_id: int) -> Any:
    if isinstance(value, (list, tuple)):
        value = pad_constraints(value, pad_id)
    if isinstance(value, np.ndarray):
        if value.ndim not in ranks:
            raise ValueError(f"{caller}: {name} must have rank {' or '.join(map(str, ranks))}, got shape "
                             f"{value.shape}.")
        _check_phrases(caller, name, value, batch, _vocab_size(model), pad_id, bos_id, eos_id)
    tensor = ops.convert_to_tensor(value, "int32")
    if len(tensor.shape) not in ranks:
        raise ValueError(f"{caller}: {name} must have rank {' or '.join(map(str, ranks))}, got shape "
                         f"{tensor.shape}.")
    return tensor


def _at_least_one(tensor: Any, axis: int, pad_id: int) -> Any:
    """Pads a statically empty axis to width 1 with `pad_id` (no phrase), so that every shape is at least 1."""
    if tensor.shape[axis] == 0:
        widths = [[0, 0]] * len(tensor.shape)
        widths[axis] = [0, 1]
        tensor = ops.pad(tensor, widths, constant_values=pad_id)
    return tensor


class Phrases:
    """Padded phrases `(B, P, L)` with what matching them needs, computed once per search.

    `aligned[b, p, j]` is the first j tokens of phrase p right-aligned in a frame of L positions (`use[j]` says
    which positions they fill), so "the last j tokens of a frame are the first j of phrase p" is one comparison
    for every j at once (`suffix_matches`).
    """

    def __init__(self, phrases: Any, pad_id: int) -> None:
        self.phrases = phrases  # (B, P, L)
        self.lengths = ops.sum(ops.cast(ops.not_equal(phrases, pad_id), "int32"), axis=-1)  # (B, P)
        width = ops.shape(phrases)[-1]
        self.width = width
        column = ops.expand_dims(ops.arange(width, dtype="int32"), 0)  # (1, L)
        prefix = ops.expand_dims(ops.arange(width + 1, dtype="int32"), 1)  # (L + 1, 1): j
        source = column - (width - prefix)  # (L + 1, L): which token of the phrase sits at each position
        self.use = ops.greater_equal(source, 0)
        self.aligned = ops.take(phrases, ops.clip(source, 0, width - 1), axis=2)  # (B, P, L + 1, L)
        self.prefix = ops.reshape(ops.arange(width + 1, dtype="int32"), (1, 1, 1, -1))  # j, as (1, 1, 1, L + 1)

    def suffix_matches(self, frames: Any) -> Any:
        """`frames (B, X, L)` -> bool `(B, X, P, L + 1)`: whether the frame's last j tokens are phrase p's first j
        (j <= its length)."""
        equal = ops.equal(frames[:, :, None, None, :], ops.expand_dims(self.aligned, 1))  # (B, X, P, L + 1, L)
        matched = ops.all(ops.logical_or(equal, ops.logical_not(self.use)), axis=-1)
        return ops.logical_and(matched, ops.less_equal(self.prefix, self.lengths[:, None, :, None]))

    def completed(self, matches: Any) -> Any:
        """`suffix_matches` -> bool `(B, X, P)`: the frame ends with the whole (non-empty) phrase."""
        whole = ops.equal(self.prefix, self.lengths[:, None, :, None])
        return ops.logical_and(ops.any(ops.logical_and(matches, whole), axis=-1), ops.greater(self.lengths, 0)[:, None])

    def progress(self, matches: Any) -> Any:
        """`suffix_matches` -> int32 `(B, X, P)`: the longest proper prefix of each phrase the frame ends with."""
        partial = ops.logical_and(matches, ops.less(self.prefix, self.lengths[:, None, :, None]))
        return ops.max(ops.where(partial, self.prefix, 0), axis=-1)

    def token_at(self, position: Any) -> Any:
        """int32 `(B, X, P)` positions -> the phrases' tokens there (`pad`-free positions only are meaningful)."""
        columns = ops.arange(self.width, dtype="int32")
        chosen = ops.equal(ops.expand_dims(position, -1), columns)  # (B, X, P, L)
        return ops.sum(ops.where(chosen, ops.expand_dims(self.phrases, 1), 0), axis=-1)


def last_tokens(sequences: Any, t: Any, width: Any) -> Any:
    """`sequences (B, R, T + 1)` (column 0 bos, column t the newest token) -> int32 `(B, R, width)`: the newest
    `width` output tokens, `SENTINEL` before the first."""
    columns = t - width + 1 + ops.arange(width, dtype="int32")  # (width,)
    picked = ops.take(sequences, ops.clip(columns, 0, ops.shape(sequences)[-1] - 1), axis=2)
    return ops.where(ops.greater_equal(columns, 1), picked, SENTINEL)


def frames_with_history(history: Any) -> Any:
    """`(B, R, L - 1)` newest tokens -> `(B, R, L)` frames: `SENTINEL` first (no token of a proper prefix)."""
    return ops.concatenate([ops.full(ops.shape(history)[:2] + (1,), SENTINEL, "int32"), history], axis=-1)


# ------------------------------------------------------------------------------------------------ banned phrases


def banned_ids(caller: str, banned: Any, source: Any, model: Any = None, pad_id: int = 0, bos_id: int = 2,
               eos_id: int = 3) -> Any:
    """`banned` as int32 `(B, Q, L)`: per-sentence lists of phrases, a `(B, Q, L)` array, or a `(Q, L)` array
    banned in every sentence; concrete ids are checked (vocabulary, no bos or eos, padding last).

    Example:

    >>> tuple(banned_ids("greedy_decode", np.array([[5, 6], [7, 0]]), np.array([[4, 3], [5, 3]])).shape)
    (2, 2, 2)
    """
    batch = ops.shape(source)[0]
    if isinstance(banned, (list, tuple)):
        banned = pad_constraints(banned, pad_id)
    if isinstance(banned, np.ndarray) and banned.ndim == 2:
        _check_phrases(caller, "banned", banned, None, _vocab_size(model), pad_id, bos_id, eos_id)
        banned = np.repeat(banned[None], batch, axis=0) if isinstance(batch, int) else banned
    tensor = _as_tensor(caller, "banned", banned, (2, 3), batch, model, pad_id, bos_id, eos_id)
    if len(tensor.shape) == 2:  # a tensor (Q, L): every sentence
        tensor = ops.repeat(ops.expand_dims(tensor, 0), batch, axis=0)
    return _at_least_one(_at_least_one(tensor, 1, pad_id), 2, pad_id)


class Bans:
    """Banned phrases `(B, Q, L)` prepared for `mask`."""

    def __init__(self, banned: Any, pad_id: int) -> None:
        self.phrases = Phrases(banned, pad_id)
        lengths = self.phrases.lengths
        self.last = self.phrases.token_at(ops.expand_dims(ops.maximum(lengths - 1, 0), 1))[:, 0]  # (B, Q)

    def mask(self, sequences: Any, t: Any, vocab: int) -> Any:
        """bool `(B, R, V)`: the tokens that would complete a banned phrase after each row of `sequences`
        `(B, R, T + 1)` at step `t`."""
        phrases = self.phrases
        frames = frames_with_history(last_tokens(sequences, t, phrases.width - 1))  # (B, R, L)
        matches = phrases.suffix_matches(frames)  # (B, R, Q, L + 1)
        lengths = phrases.lengths[:, None, :, None]
        ready = ops.any(ops.logical_and(matches, ops.equal(phrases.prefix, lengths - 1)), axis=-1)  # (B, R, Q)
        ready = ops.logical_and(ready, ops.greater(phrases.lengths, 0)[:, None])
        token = ops.where(ready, ops.expand_dims(self.last, 1), -1)  # (B, R, Q)
        ids = ops.arange(vocab, dtype="int32")
        return ops.any(ops.equal(ops.expand_dims(token, -1), ids), axis=2)  # (B, R, V)

    def apply(self, log_probs: Any, sequences: Any, t: Any, rows_per_sentence: int, keep: Any = None) -> Any:
        """`log_probs (B*R, V)` with every banned completion at -inf (rows of `keep`, bool `(B*R,)`, left as they
        are: a forced prefix). `sequences` is `(B*R, T + 1)`, R rows per sentence."""
        vocab = int(log_probs.shape[-1])
        grouped = ops.reshape(sequences, (-1, rows_per_sentence, ops.shape(sequences)[-1]))
        banned = ops.reshape(self.mask(grouped, t, vocab), (-1, vocab))
        if keep is not None:
            banned = ops.logical_and(banned, ops.logical_not(ops.expand_dims(keep, 1)))
        return ops.where(banned, NEG_INF, log_probs)


# ------------------------------------------------------------------------------------------- positive constraints


def constraint_ids(caller: str, constraints: Any, source: Any, model: Any = None, pad_id: int = 0, bos_id: int = 2,
                   eos_id: int = 3) -> Any:
    """`constraints` as int32 `(B, C, F, L)`: per-sentence lists (`pad_constraints`), or an array `(B, C, L)` or
    `(B, C, F, L)` padded with `pad_id`; concrete ids are checked (one row per source, inside the target
    vocabulary, no bos or eos, padding last).

    Example:

    >>> tuple(constraint_ids("beam_search", [[[5, 6]], [[7], [8]]], np.array([[4, 3], [5, 3]])).shape)
    (2, 2, 1, 2)
    >>> constraint_ids("beam_search", [[[5, 3]]], np.array([[4, 3]]))
    Traceback (most recent call last):
    ...
    ValueError: beam_search: constraints hold eos (3); a phrase is ordinary target tokens.
    """
    tensor = _as_tensor(caller, "constraints", constraints, (3, 4), ops.shape(source)[0], model, pad_id, bos_id,
                        eos_id)
    if len(tensor.shape) == 3:
        tensor = ops.expand_dims(tensor, 2)
    for axis in (1, 2, 3):
        tensor = _at_least_one(tensor, axis, pad_id)
    return tensor


class Constraints:
    """Positive constraints `(B, C, F, L)` prepared for the search: the phrases `(B, P = C*F, L)`, which fit
    (`room`: int32 `(B,)`, the tokens each sentence may still produce), and the identical copies.

    A hypothesis's state is `met`, bool `(B, K, P)`: the phrases it has completed.
    """

    def __init__(self, constraints: Any, room: Any, pad_id: int) -> None:
        shape = ops.shape(constraints)
        self.count, self.forms = shape[1], shape[2]
        self.phrases = Phrases(ops.reshape(constraints, (shape[0], -1, shape[3])), pad_id)
        lengths = ops.reshape(self.phrases.lengths, (shape[0], self.count, self.forms))  # (B, C, F)
        present = ops.greater(lengths, 0)
        large = ops.convert_to_tensor(2**30, "int32")
        shortest = ops.min(ops.where(present, lengths, large), axis=-1)  # (B, C)
        wanted = ops.any(present, axis=-1)
        # Keep the constraints that fit, the shortest first (ties: the earlier).
        index = ops.arange(self.count, dtype="int32")
        first = ops.logical_or(ops.less(shortest[:, None, :], shortest[:, :, None]),
                               ops.logical_and(ops.equal(shortest[:, None, :], shortest[:, :, None]),
                                               ops.less_equal(index[None, :], index[:, None])))  # (B, C, C')
        needed = ops.sum(ops.where(ops.logical_and(first, wanted[:, None, :]), shortest[:, None, :], 0), axis=-1)
        self.active = ops.logical_and(wanted, ops.less_equal(needed, ops.expand_dims(room, 1)))  # (B, C)
        self.full = ops.max(lengths, axis=-1)  # (B, C): a met constraint's tokens, for the banks
        self.banks = self.count * self.phrases.width + 1  # more than any hypothesis's bank
        phrase_active = ops.logical_and(ops.reshape(ops.repeat(ops.expand_dims(self.active, 2), self.forms, axis=2),
                                                    (shape[0], -1)), ops.greater(self.phrases.lengths, 0))
        self.phrase_active = phrase_active  # (B, P)
        self.copies = _earlier_copies(self.phrases, phrase_active)  # (B, P, P)

    def initial(self, beams: int) -> Any:
        """The state of the first hypotheses: nothing met, `(B, K, P)`."""
        return ops.zeros(ops.shape(self.phrases.lengths)[:1] + (beams, ops.shape(self.phrases.lengths)[1]), "bool")

    def groups(self, met: Any) -> Any:
        """`(B, X, P)` per phrase -> `(B, X, C)` per constraint (any form met)."""
        shape = ops.shape(met)
        return ops.any(ops.reshape(met, (shape[0], shape[1], self.count, self.forms)), axis=-1)

    def proposals(self, met: Any, history: Any) -> tuple[Any, Any]:
        """The next token of every unmet active constraint after each hypothesis: `(tokens, proposed)`, int32 and
        bool `(B, K, P)`. `history (B, K, L - 1)`: each hypothesis's newest tokens."""
        progress = self.phrases.progress(self.phrases.suffix_matches(frames_with_history(history)))  # (B, K, P)
        unmet = ops.logical_not(ops.repeat(self.groups(met), self.forms, axis=2))
        proposed = ops.logical_and(unmet, ops.expand_dims(self.phrase_active, 1))
        return self.phrases.token_at(progress), proposed

    def advance(self, met: Any, history: Any, tokens: Any) -> tuple[Any, Any, Any]:
        """The state after each candidate: `met (B, K, P)` of the parents, `tokens (B, K, M)` appended to
        `history (B, K, L - 1)` -> `(met (B, K, M, P), all_met (B, K, M), bank (B, K, M))`."""
        batch, beams, width = ops.shape(tokens)[0], ops.shape(tokens)[1], ops.shape(tokens)[2]
        frames = ops.concatenate([ops.repeat(ops.expand_dims(history, 2), width, axis=2),
                                  ops.expand_dims(tokens, -1)], axis=-1)  # (B, K, M, L)
        frames = ops.reshape(frames, (batch, beams * width, -1))
        matches = self.phrases.suffix_matches(frames)  # (B, K*M, P, L + 1)
        completed = ops.reshape(self.phrases.completed(matches), (batch, beams, width, -1))
        progress = ops.reshape(self.phrases.progress(matches), (batch, beams, width, -1))
        parent = ops.expand_dims(met, 2)  # (B, K, 1, P)
        # A phrase with an unmet identical copy before it waits for that copy to be met first.
        waiting = ops.any(ops.logical_and(self.copies[:, None], ops.logical_not(ops.expand_dims(met, 2))), axis=-1)
        newly = ops.logical_and(completed, ops.logical_and(ops.logical_not(ops.expand_dims(waiting, 2)),
                                                           self.phrase_active[:, None, None]))
        met = ops.logical_or(parent, newly)  # (B, K, M, P)
        flat_met = ops.reshape(met, (batch, beams * width, -1))
        met_groups = ops.reshape(self.groups(flat_met), (batch, beams, width, -1))  # (B, K, M, C)
        shape = (batch, beams, width, self.count, self.forms)
        partial = ops.max(ops.reshape(progress, shape), axis=-1)  # (B, K, M, C)
        active = self.active[:, None, None]
        all_met = ops.all(ops.logical_or(met_groups, ops.logical_not(active)), axis=-1)
        unmet = ops.logical_and(active, ops.logical_not(met_groups))
        bank = (ops.sum(ops.where(ops.logical_and(active, met_groups), self.full[:, None, None], 0), axis=-1)
                + ops.max(ops.where(unmet, partial, 0), axis=-1))  # met tokens + the furthest progress
        return met, all_met, bank


def _earlier_copies(phrases: Phrases, active: Any) -> Any:
    """bool `(B, P, P')`: phrase P' comes before P, is identical to it, and both are active."""
    same = ops.all(ops.equal(phrases.phrases[:, :, None], phrases.phrases[:, None, :]), axis=-1)
    index = ops.arange(ops.shape(same)[1], dtype="int32")
    earlier = ops.less(index[None, :], index[:, None])  # (P, P')
    both = ops.logical_and(active[:, :, None], active[:, None, :])
    return ops.logical_and(ops.logical_and(same, earlier), both)


def stripe_order(totals: Any, bank: Any, banks: Any) -> Any:
    """The candidates of each sentence in dynamic-beam-allocation order: `totals`, `bank` `(B, X)` (score, -inf
    for none; constraint tokens met) -> float32 `(B, X)` keys, lower first.

    Round robin across the banks, the fullest bank first: a candidate's key is (its rank in its bank by score,
    ties to the lower index) * `banks` + (`banks` - 1 - its bank); a candidate that is none comes last. With one
    bank this is the order by score.
    """
    valid = ops.greater(totals, NEG_INF)
    index = ops.arange(ops.shape(totals)[1], dtype="int32")
    before = ops.logical_or(ops.greater(totals[:, None, :], totals[:, :, None]),
                            ops.logical_and(ops.equal(totals[:, None, :], totals[:, :, None]),
                                            ops.less(index[None, :], index[:, None])))  # (B, X, X'): X' ranks first
    rival = ops.logical_and(ops.logical_and(before, ops.equal(bank[:, None, :], bank[:, :, None])), valid[:, None, :])
    rank = ops.sum(ops.cast(rival, "int32"), axis=-1)
    key = ops.cast(rank * banks + (banks - 1 - bank), "float32")
    return ops.where(valid, key, 3.0e38)


def constraints_met(tokens: Any, constraints: Any, pad_id: int = 0) -> Any:
    """Which constraints each output contains: bool `(B, R, C)` (True also for a constraint slot of padding).

    Args:
        tokens: int `(B, R, T)` outputs (as `beam_search` returns them), or `(B, T)`.
        constraints: as `beam_search` takes them (`constraint_ids`): `(B, C, L)`, `(B, C, F, L)` or lists.
        pad_id: the padding id.

    A constraint given twice counts as met when its phrase occurs twice (one of several forms: any).

    Example:

    >>> np.asarray(constraints_met(np.array([[7, 5, 6, 3]]), [[[5, 6], [6, 7]]])).tolist()
    [[True, False]]
    """
    tokens = ops.convert_to_tensor(tokens, "int32")
    flat = len(tokens.shape) == 2
    if flat:
        tokens = ops.expand_dims(tokens, 1)
    if isinstance(constraints, (list, tuple)):
        constraints = pad_constraints(constraints, pad_id, forms=True)
    constraints = ops.convert_to_tensor(constraints, "int32")
    if len(constraints.shape) == 3:
        constraints = ops.expand_dims(constraints, 2)
    shape = ops.shape(constraints)
    phrases = Phrases(ops.reshape(constraints, (shape[0], -1, shape[3])), pad_id)
    batch, rows, length, width = ops.shape(tokens)[0], ops.shape(tokens)[1], ops.shape(tokens)[2], phrases.width
    positions = ops.arange(length, dtype="int32")[:, None] - width + 1 + ops.arange(width, dtype="int32")  # (T, L)
    frames = ops.take(tokens, ops.clip(positions, 0, length - 1), axis=2)  # (B, R, T, L)
    frames = ops.where(ops.greater_equal(positions, 0), frames, SENTINEL)
    frames = ops.reshape(frames, (batch, rows * length, width))
    ends = ops.reshape(phrases.completed(phrases.suffix_matches(frames)), (batch, rows, length, -1))
    occurrences = ops.sum(ops.cast(ends, "int32"), axis=2)  # (B, R, P)
    present = ops.greater(phrases.lengths, 0)
    copies = ops.sum(ops.cast(_earlier_copies(phrases, present), "int32"), axis=-1)  # (B, P): copies before it
    found = ops.greater(occurrences, ops.expand_dims(copies, 1))
    groups = ops.reshape(found, (batch, rows, shape[1], shape[2]))
    wanted = ops.any(ops.reshape(present, (shape[0], shape[1], shape[2])), axis=-1)  # (B, C)
    met = ops.logical_or(ops.any(groups, axis=-1), ops.logical_not(wanted)[:, None])
    return met[:, 0] if flat else met
