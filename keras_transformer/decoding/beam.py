"""Beam search with the GNMT length penalty: the paper's decoding (beam 4, alpha 0.6).

Beam search keeps `K` alive and `K` finished hypotheses per sentence in
fixed-shape tensors; when hypotheses are reordered, each layer's cache rows
are reordered with one gather per tensor. Candidates are chosen from each
hypothesis's own best `2K + 2` tokens, so the full `(B, K*V)` score table is
never built. The loop stops as soon as no sentence's returned hypotheses can
change any more.
"""

from typing import Any

from keras import ops

from keras_transformer.decoding.constraints import (
    Bans,
    Constraints,
    banned_ids,
    constraint_ids,
    last_tokens,
    stripe_order,
)
from keras_transformer.decoding.options import DecodeOptions
from keras_transformer.decoding.search import (
    NEG_INF,
    cache_stages,
    check_options,
    ensemble_members,
    excluded,
    forced_token,
    length_penalty,
    output_limits,
    prefix_lengths,
    prefix_rows,
    search_loop,
    split_start,
    step_function,
    target_prefix_ids,
    token_ids,
    with_prefix_room,
    write_column,
)


def top_k_by_blocks(values: Any, k: Any, block: int = 32) -> Any:
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


def _flat_index(beam_index: Any, beams: Any) -> Any:
    """`(B, M)` beam numbers -> `(B*M,)` row numbers of a `(B*beams, ...)` tensor."""
    batch = ops.shape(beam_index)[0]
    offsets = ops.expand_dims(ops.arange(batch, dtype="int32") * beams, 1)  # (B, 1)
    return ops.reshape(offsets + ops.cast(beam_index, "int32"), (-1,))


def _gather_beams(x: Any, beam_index: Any) -> Any:
    """`x (B, K, ...)`, `beam_index (B, M)` -> `(B, M, ...)`: x[b, beam_index[b, m]]."""
    shape = ops.shape(x)
    flat = ops.reshape(x, (shape[0] * shape[1], *shape[2:]))
    picked = ops.take(flat, _flat_index(beam_index, shape[1]), axis=0)
    return ops.reshape(picked, (shape[0], ops.shape(beam_index)[1], *shape[2:]))


def beam_search(model: Any, source: Any, beam_size: int = 4, alpha: float = 0.6, max_extra: int = 50,
                max_length: int | None = None, num_return: int = 1, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3,
                use_cache: bool = True, first_cache_stage: int | None = None, early_exit: bool = False,
                return_steps: bool = False, target_prefix: Any = None,
                constraints: Any = None, banned: Any = None, start_from_prefix: bool = False) -> Any:
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

    With a `target_prefix`, each sentence's first steps extend its one live
    hypothesis by its forced tokens only (every beam then starts with the
    prefix, which counts in its log-probability and its length), and the
    search proper starts after them, from that hypothesis, as it starts from
    bos without one.

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
        target_prefix: optional int `(B, P)` forced first tokens per sentence, as in `greedy_decode`.
        constraints: optional phrases every output must contain, per sentence: int `(B, C, L)` or `(B, C, F, L)`
            (F alternative forms) padded with `pad_id`, or lists (`constraints.pad_constraints`). The search is
            then dynamic beam allocation (`decoding.constraints`); which constraints each returned hypothesis
            meets: `constraints_met(tokens, constraints)`. None: the search above, unchanged.
        banned: optional phrases no output may contain: int `(B, Q, L)` per sentence, `(Q, L)` for all, or lists.
        start_from_prefix: as in `greedy_decode`.

    Returns:
        `(tokens, scores)`: int32 `(B, num_return, T)` hypotheses, best first
        (each starting with its sentence's prefix), ending with eos and padded
        with `pad_id`; float32 `(B, num_return)` scores log P(tokens | source)
        / lp(length), where tokens and length count the prefix and eos.
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
    source = token_ids("beam_search", "source", source, models[0])
    batch = ops.shape(source)[0]
    limits, steps = output_limits(models[0], source, pad_id, max_extra, max_length)  # (B,), T_max
    if target_prefix is not None:
        target_prefix = target_prefix_ids("beam_search", target_prefix, source, models[0], pad_id, bos_id, eos_id)
        starts = None
        if start_from_prefix:
            starts, target_prefix = split_start(target_prefix, bos_id, pad_id)  # (B,), (B, P)
        limits, steps = with_prefix_room(limits, steps, target_prefix, models[0], pad_id)
        forced_rows = prefix_rows(target_prefix, beams, pad_id)  # (B*K, P + 1)
    bans = None if banned is None else Bans(banned_ids("beam_search", banned, source, models[0], pad_id, bos_id,
                                                      eos_id), pad_id)
    if constraints is not None:
        constraints = constraint_ids("beam_search", constraints, source, models[0], pad_id, bos_id, eos_id)
    best_possible_penalty = length_penalty(limits, alpha)  # (B,)
    stages = cache_stages(steps, first_cache_stage) if use_cache else [steps]
    step, cache = step_function(models, source, pad_id, beams, steps, use_cache, stages[0],
                                None if target_prefix is None else starts)
    if constraints is not None:
        room = limits if target_prefix is None else limits - prefix_lengths(target_prefix, pad_id)
        search = _ConstrainedSearch(step, Constraints(constraints, room, pad_id), bans, beams, alpha, limits, steps,
                                    pad_id, bos_id, eos_id, use_cache, early_exit,
                                    None if target_prefix is None else forced_rows)
        return search.run(cache, stages, int(num_return), return_steps)

    empty = ops.full((batch, beams, steps + 1), pad_id, dtype="int32")  # (B, K, T_max + 1)
    first_beam_only = ops.where(ops.arange(beams) == 0, 0.0, NEG_INF)  # only beam 0 is live at t = 0
    state = {
        "t": ops.convert_to_tensor(0, "int32"),
        "alive": write_column(empty, 0, ops.full((batch, beams), bos_id, dtype="int32")),
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

    def cond(state: Any) -> Any:
        return ops.logical_and(ops.less(state["t"], steps), ops.logical_not(ops.all(state["done"])))

    def body(state: Any) -> Any:
        t = state["t"]
        length = t + 1  # tokens in every hypothesis after this step, eos included

        # Extend every alive hypothesis by every token and keep the best 2K candidates. They are
        # among each hypothesis's own best 2K tokens other than pad and bos, so each row keeps its
        # best 2K + 2 tokens first (ties: the lower id, as a top_k over all K*V candidates would).
        flat_alive = ops.reshape(state["alive"], (batch * beams, steps + 1))
        values, normalizer, cache = step(flat_alive, t, state["cache"])  # (B*K, V), (B*K, 1)
        forced = None if target_prefix is None else forced_token(forced_rows, t, pad_id)
        if bans is not None:  # a banned phrase's last token after the rest of it: -inf (a prefix's tokens stay)
            values = bans.apply(values, flat_alive, t, beams, keep=None if forced is None else forced[1])
        per_row = min(2 * beams + 2, int(values.shape[-1]))
        row_tokens, row_log_probs = _row_candidates(values, normalizer, per_row, pad_id, bos_id, eos_id, forced)
        candidates = ops.expand_dims(state["alive_log_probs"], 2) + ops.reshape(row_log_probs,
                                                                                 (batch, beams, per_row))
        top_log_probs, top_index = ops.top_k(ops.reshape(candidates, (batch, beams * per_row)), 2 * beams)
        top_beam = ops.cast(top_index // per_row, "int32")  # (B, 2K) which hypothesis it extends
        top_token = ops.take_along_axis(ops.reshape(ops.cast(row_tokens, "int32"), (batch, beams * per_row)),
                                        top_index, axis=1)  # (B, 2K) with which token
        top_sequences = write_column(_gather_beams(state["alive"], top_beam), length, top_token)

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

    state = search_loop(cond, body, state, stages)
    scores = state["finished_scores"][:, :num_return]  # (B, R)
    tokens = state["finished"][:, :num_return, 1:]  # (B, R, T_max)
    # A slot that never received a hypothesis (tiny vocabularies only) comes back as all padding.
    tokens = ops.where(ops.expand_dims(ops.isfinite(scores), 2), tokens, pad_id)
    if return_steps:
        return tokens, scores, state["t"]
    return tokens, scores


def _row_candidates(values: Any, normalizer: Any, per_row: int, pad_id: int, bos_id: int, eos_id: int,
                    forced: Any = None) -> tuple[Any, Any]:
    """Each hypothesis's best `per_row` next tokens and their log-probabilities, `(tokens, log_probs)` of shape
    `(B*K, per_row)`: pad and bos excluded (-inf); ties go to the lower id, as a top_k over all K*V candidates.

    `forced`: `forced_token`'s `(token, is_forced)` for this step, or None. A row inside its target prefix has one
    candidate, its forced token (at its own log-probability); the others become padding at -inf, which never ends
    a hypothesis.
    """
    row_values, row_tokens = top_k_by_blocks(values, per_row)  # (B*K, k)
    row_log_probs = ops.where(excluded(row_tokens, pad_id, bos_id, eos_id), NEG_INF, row_values - normalizer)
    if forced is None:
        return row_tokens, row_log_probs
    token, is_forced = forced  # (B*K,)
    forced_log_prob = ops.take_along_axis(values, ops.expand_dims(token, 1), axis=1) - normalizer
    first = ops.expand_dims(ops.arange(per_row) == 0, 0)  # (1, k)
    is_forced = ops.expand_dims(is_forced, 1)  # (B*K, 1)
    row_tokens = ops.where(is_forced, ops.where(first, ops.expand_dims(token, 1), pad_id),
                           ops.cast(row_tokens, "int32"))
    row_log_probs = ops.where(is_forced, ops.where(first, forced_log_prob, NEG_INF), row_log_probs)
    return row_tokens, row_log_probs



class _ConstrainedSearch:
    """`beam_search` with positive constraints: dynamic beam allocation (`decoding.constraints`).

    The step is the unconstrained one's with three changes. Each hypothesis's candidates are its best `2K + 2`
    tokens and the next token of each of its unmet constraints; eos is a candidate only for a hypothesis that
    meets every constraint (or at the length limit). The `2K` candidates kept are the first in
    `constraints.stripe_order` (round robin across the banks of constraint tokens met), not the best by score;
    those among the first K that end join the finished list, and the first K that go on stay alive. A hypothesis
    ended by the length limit with a constraint unmet goes to a second list, returned only after every
    hypothesis that meets them all. Without any constraint in a sentence (or none that fits) its search is the
    unconstrained one.
    """

    def __init__(self, step: Any, wanted: Constraints, bans: Bans | None, beams: int, alpha: float, limits: Any,
                 steps: Any, pad_id: int, bos_id: int, eos_id: int, use_cache: bool, early_exit: bool,
                 forced_rows: Any) -> None:
        self.step, self.wanted, self.bans, self.beams, self.alpha = step, wanted, bans, beams, alpha
        self.limits, self.steps, self.use_cache, self.early_exit = limits, steps, use_cache, early_exit
        self.pad_id, self.bos_id, self.eos_id, self.forced_rows = pad_id, bos_id, eos_id, forced_rows

    def run(self, cache: Any, stages: Any, num_return: int, return_steps: bool) -> Any:
        beams, steps, pad_id = self.beams, self.steps, self.pad_id
        batch = ops.shape(self.limits)[0]
        empty = ops.full((batch, beams, steps + 1), pad_id, dtype="int32")  # (B, K, T_max + 1)
        first_beam_only = ops.where(ops.arange(beams) == 0, 0.0, NEG_INF)
        nothing = ops.full((batch, beams), NEG_INF, dtype="float32")
        state = {
            "t": ops.convert_to_tensor(0, "int32"),
            "alive": write_column(empty, 0, ops.full((batch, beams), self.bos_id, dtype="int32")),
            "alive_log_probs": ops.tile(ops.expand_dims(ops.cast(first_beam_only, "float32"), 0), (batch, 1)),
            "met": self.wanted.initial(beams),  # (B, K, P) the phrases each alive hypothesis has completed
            "finished": empty, "finished_scores": nothing,  # ended meeting every constraint
            "fallback": empty, "fallback_scores": nothing,  # ended by the length limit with one unmet
            "done": ops.zeros((batch,), "bool"),
            "cache": cache,
        }
        if self.early_exit:
            state["best_ended"] = ops.zeros((batch,), "bool")
            state["ended"] = ops.zeros((batch,), "int32")
        self.returned = num_return - 1

        def cond(state: Any) -> Any:
            return ops.logical_and(ops.less(state["t"], steps), ops.logical_not(ops.all(state["done"])))

        state = search_loop(cond, self.body, state, stages)
        scores = state["finished_scores"]  # (B, K), those that meet every constraint first
        count = ops.sum(ops.cast(ops.isfinite(scores), "int32"), axis=1, keepdims=True)  # (B, 1)
        slot = ops.expand_dims(ops.arange(num_return, dtype="int32"), 0)  # (1, R)
        index = ops.where(ops.less(slot, count), slot, beams + slot - count)  # (B, R) into [finished, fallback]
        scores = ops.take_along_axis(ops.concatenate([scores, state["fallback_scores"]], 1), index, axis=1)
        tokens = _gather_beams(ops.concatenate([state["finished"], state["fallback"]], 1), index)[:, :, 1:]
        tokens = ops.where(ops.expand_dims(ops.isfinite(scores), 2), tokens, pad_id)
        if return_steps:
            return tokens, scores, state["t"]
        return tokens, scores

    def candidates(self, state: Any, values: Any, normalizer: Any, forced: Any, history: Any) -> tuple[Any, Any]:
        """Every alive hypothesis's candidates: int32 tokens and float32 log-probabilities `(B, K, M)`, M = its
        best `2K + 2` tokens then one per phrase (-inf where not proposed, or already among the first)."""
        beams = self.beams
        per_row = min(2 * beams + 2, int(values.shape[-1]))
        row_tokens, row_log_probs = _row_candidates(values, normalizer, per_row, self.pad_id, self.bos_id,
                                                    self.eos_id, forced)  # (B*K, W)
        row_tokens = ops.cast(row_tokens, "int32")
        next_tokens, proposed = self.wanted.proposals(state["met"], history)  # (B, K, P)
        rows = ops.shape(values)[0]
        next_tokens = ops.reshape(next_tokens, (rows, -1))  # (B*K, P)
        proposed = ops.reshape(proposed, (rows, -1))
        next_log_probs = ops.take_along_axis(values, next_tokens, axis=1) - normalizer
        index = ops.arange(ops.shape(next_tokens)[1], dtype="int32")
        earlier = ops.less(index[None, :], index[:, None])  # (P, P')
        repeated = ops.logical_or(
            ops.any(ops.equal(next_tokens[:, :, None], row_tokens[:, None, :]), axis=-1),
            ops.any(ops.logical_and(ops.logical_and(ops.equal(next_tokens[:, :, None], next_tokens[:, None, :]),
                                                    earlier), proposed[:, None, :]), axis=-1))
        keep = ops.logical_and(proposed, ops.logical_not(repeated))
        if forced is not None:  # inside its target prefix a row has its forced token only
            keep = ops.logical_and(keep, ops.logical_not(ops.expand_dims(forced[1], 1)))
        next_log_probs = ops.where(keep, next_log_probs, NEG_INF)
        batch = ops.shape(state["alive"])[0]
        tokens = ops.reshape(ops.concatenate([row_tokens, next_tokens], 1), (batch, beams, -1))
        log_probs = ops.reshape(ops.concatenate([row_log_probs, next_log_probs], 1), (batch, beams, -1))
        return tokens, log_probs

    def body(self, state: Any) -> Any:
        beams, steps, alpha, eos_id = self.beams, self.steps, self.alpha, self.eos_id
        t = state["t"]
        length = t + 1
        batch = ops.shape(state["alive"])[0]
        flat_alive = ops.reshape(state["alive"], (batch * beams, steps + 1))
        values, normalizer, cache = self.step(flat_alive, t, state["cache"])  # (B*K, V), (B*K, 1)
        forced = None if self.forced_rows is None else forced_token(self.forced_rows, t, self.pad_id)
        if self.bans is not None:
            values = self.bans.apply(values, flat_alive, t, beams, keep=None if forced is None else forced[1])
        history = last_tokens(state["alive"], t, self.wanted.phrases.width - 1)  # (B, K, L - 1)
        tokens, log_probs = self.candidates(state, values, normalizer, forced, history)  # (B, K, M)
        width = ops.shape(tokens)[2]
        met, all_met, bank = self.wanted.advance(state["met"], history, tokens)  # (B, K, M, P), (B, K, M) x 2
        at_limit = ops.reshape(ops.greater_equal(length, self.limits), (-1, 1, 1))  # (B, 1, 1)
        totals = ops.expand_dims(state["alive_log_probs"], 2) + log_probs
        early_eos = ops.logical_and(ops.equal(tokens, eos_id), ops.logical_not(ops.logical_or(all_met, at_limit)))
        totals = ops.reshape(ops.where(early_eos, NEG_INF, totals), (batch, -1))  # (B, K*M)

        # The 2K candidates kept, in dynamic-beam-allocation order.
        keys = stripe_order(totals, ops.reshape(bank, (batch, -1)), self.wanted.banks)
        pick = ops.cast(ops.top_k(-keys, 2 * beams)[1], "int32")  # (B, 2K)
        top_log_probs = ops.take_along_axis(totals, pick, axis=1)
        top_beam = pick // width
        top_token = ops.take_along_axis(ops.reshape(tokens, (batch, -1)), pick, axis=1)
        top_met = _gather_beams(ops.reshape(met, (batch, beams * width, -1)), pick)  # (B, 2K, P)
        top_all_met = ops.take_along_axis(ops.reshape(all_met, (batch, -1)), pick, axis=1)
        top_sequences = write_column(_gather_beams(state["alive"], top_beam), length, top_token)
        valid = ops.greater(top_log_probs, NEG_INF)
        ends = ops.logical_and(ops.logical_or(ops.equal(top_token, eos_id), at_limit[:, :, 0]), valid)
        goes_on = ops.logical_and(valid, ops.logical_not(ends))

        # Alive: the first K that go on.
        order = ops.cast(ops.arange(2 * beams), "float32")
        alive_pick = ops.cast(ops.top_k(ops.where(goes_on, -order, NEG_INF), beams)[1], "int32")  # (B, K)
        alive_log_probs = ops.where(ops.take_along_axis(goes_on, alive_pick, axis=1),
                                    ops.take_along_axis(top_log_probs, alive_pick, axis=1), NEG_INF)
        alive = _gather_beams(top_sequences, alive_pick)
        parent = ops.take_along_axis(top_beam, alive_pick, axis=1)
        if self.use_cache:
            rows = _flat_index(parent, beams)
            cache = tuple(tuple(ops.take(tensor, rows, axis=0) for tensor in pair) for pair in cache)

        # Finished: those of the first K that end; meeting every constraint, or (at the limit) as a fallback.
        ends = ops.logical_and(ends, ops.arange(2 * beams) < beams)
        scored = top_log_probs / length_penalty(length, alpha)
        new_scores = ops.where(ops.logical_and(ends, top_all_met), scored, NEG_INF)
        new_fallback = ops.where(ops.logical_and(ends, ops.logical_not(top_all_met)), scored, NEG_INF)
        if self.early_exit:
            stopped = ops.expand_dims(state["done"], 1)
            new_scores = ops.where(stopped, NEG_INF, new_scores)
            new_fallback = ops.where(stopped, NEG_INF, new_fallback)
        finished_scores, chosen = ops.top_k(ops.concatenate([state["finished_scores"], new_scores], 1), beams)
        finished = _gather_beams(ops.concatenate([state["finished"], top_sequences], 1), chosen)
        fallback_scores, chosen = ops.top_k(ops.concatenate([state["fallback_scores"], new_fallback], 1), beams)
        fallback = _gather_beams(ops.concatenate([state["fallback"], top_sequences], 1), chosen)

        best_alive_bound = ops.max(alive_log_probs, axis=1) / length_penalty(self.limits, alpha)
        done = ops.greater_equal(finished_scores[:, self.returned], best_alive_bound)
        updated = {"t": length, "alive": alive, "alive_log_probs": alive_log_probs,
                   "met": _gather_beams(top_met, alive_pick), "finished": finished,
                   "finished_scores": finished_scores, "fallback": fallback, "fallback_scores": fallback_scores,
                   "done": done, "cache": cache}
        if self.early_exit:
            met_ends = ops.logical_and(ends, top_all_met)
            best_ended = ops.logical_or(state["best_ended"], met_ends[:, 0])
            ended = state["ended"] + ops.sum(ops.cast(met_ends, "int32"), axis=1)
            updated.update(best_ended=best_ended, ended=ended,
                           done=ops.logical_or(done, ops.logical_and(best_ended, ended >= beams)))
        return updated


def decode(models: Any, source: Any, options: DecodeOptions, pad_id: int, bos_id: int, eos_id: int,
           first_cache_stage: int | None = None, row_keys: Any = None, target_prefix: Any = None,
           constraints: Any = None, banned: Any = None, start_from_prefix: bool = False) -> tuple[Any, Any]:
    """The strategy's entry (`keras_transformer.decoding.STRATEGIES`): `beam_search` with `options` (and
    `target_prefix`, `constraints` and `banned`, as there).

    Returns `options.returned()` hypotheses per sentence, best first: int32 `(B, R, T)` and float32
    `(B, R)` scores log P / lp(length). `row_keys` (used by sampling) are not needed here.

    Example:

    >>> import numpy as np
    >>> from keras_transformer import TransformerConfig, build_model
    >>> from keras_transformer.decoding import DecodeOptions
    >>> model = build_model(TransformerConfig.preset("tiny", vocab_size=50))
    >>> tokens, scores = decode([model], np.array([[7, 8, 3]]), DecodeOptions(beam_size=2, max_extra=3),
    ...                         pad_id=0, bos_id=2, eos_id=3)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 2, 6), (1, 2))
    """
    return beam_search(models, source, beam_size=options.beam_size, alpha=options.alpha,
                       max_extra=options.max_extra, num_return=options.returned(), pad_id=pad_id, bos_id=bos_id,
                       eos_id=eos_id, first_cache_stage=first_cache_stage, early_exit=options.early_exit,
                       target_prefix=target_prefix, constraints=constraints, banned=banned,
                       start_from_prefix=start_from_prefix)
