"""Beam search written out in Python and numpy, one sentence at a time, for tests to compare with."""

import numpy as np

from keras_transformer.model import decode, encode


def reference_beam_search(model, source, beam_size, alpha, max_extra, num_return=1, early_exit=False, pad_id=0,
                          bos_id=2, eos_id=3, prefix=()):
    """`decoding.beam_search` for one sentence, over the uncached decoder (the whole prefix every step).

    Each step extends every alive hypothesis by every token but pad and bos and keeps the 2K best
    (ties: the lower hypothesis, then the lower token); those among the K best that end (eos, or the
    length limit) join the finished list, scored log P / ((5 + length) / 6) ** alpha, which keeps its K
    best; the K best that go on stay alive. It stops when the `num_return`-th finished score is at least
    the best alive log P over the limit's penalty, at the limit, and with `early_exit` also once some
    step's best candidate ended and K hypotheses in all have ended.

    With a `prefix` (forced first tokens), the search starts from the one hypothesis bos + prefix, scored by
    the log-probability of the prefix's tokens, and the limit is at least the prefix's length + 1.

    Returns:
        `(hypotheses, steps)`: `[(tokens ending with eos, score), ...]` best first, at most `num_return`;
        and the number of steps run.
    """
    source = np.asarray([t for t in source if t != pad_id], "int32")[None]
    prefix = [int(t) for t in prefix]
    limit = max(source.shape[1] + max_extra, len(prefix) + 1)
    memory, padding = encode(model, source)

    def penalty(length):
        return ((5.0 + length) / 6.0) ** alpha

    start = 0.0
    if prefix:  # teacher-forced: the log-probability of each prefix token after the ones before it
        logits = np.asarray(decode(model, np.array([[bos_id] + prefix], "int32"), memory, padding))[0]
        logits = logits[:len(prefix)].astype("float64")
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        start = float(log_probs[np.arange(len(prefix)), prefix].sum())
    alive, finished, ended, best_ended = [([bos_id] + prefix, start)], [], 0, False
    for length in range(len(prefix) + 1, limit + 1):
        prefixes = np.array([tokens for tokens, _ in alive], "int32")
        logits = np.asarray(decode(model, prefixes, np.repeat(memory, len(alive), 0),
                                   np.repeat(padding, len(alive), 0)))[:, -1].astype("float64")
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        totals = np.array([score for _, score in alive])[:, None] + log_probs
        totals[:, [pad_id, bos_id]] = -np.inf
        flat = totals.reshape(-1)
        order = np.lexsort((np.arange(flat.size), -flat))[:2 * beam_size]
        going_on = []
        for rank, index in enumerate(order):
            hypothesis, token = divmod(int(index), log_probs.shape[1])
            tokens = alive[hypothesis][0] + [token]
            if token == eos_id or length >= limit:
                if rank < beam_size:
                    finished.append((flat[index] / penalty(length), tokens))
                    ended, best_ended = ended + 1, best_ended or rank == 0
            elif len(going_on) < beam_size:
                going_on.append((tokens, flat[index]))
        finished = sorted(finished, key=lambda item: -item[0])[:beam_size]
        alive = going_on
        exact = not alive or (len(finished) >= num_return
                              and finished[num_return - 1][0] >= alive[0][1] / penalty(limit))
        if length >= limit or exact or (early_exit and best_ended and ended >= beam_size):
            return [(tokens[1:], score) for score, tokens in finished[:num_return]], length
    raise AssertionError("unreachable: the limit ends the search")
