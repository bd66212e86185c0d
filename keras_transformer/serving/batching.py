"""The engine's thread and the batches it decodes: a bounded queue of requests, cut into chunks of at most
`max_batch` sentences that are decoded in turn (round-robin), concurrent requests asking for the same decoding
gathered into one batch; what the server did, counted."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from keras_transformer.engines.lines import clean_line
from keras_transformer.serving.requests import RequestError

if TYPE_CHECKING:
    import concurrent.futures

    from keras_transformer.decoding.options import DecodeOptions
    from keras_transformer.engines.interface import TranslatorInterface
    from keras_transformer.serving.requests import ServeSettings, Work

log = logging.getLogger("keras_transformer.serving")

# A warm-up translates this many sentences at once, so that a graph-building engine (the TensorFlow one decodes
# its first few sentences eagerly, then builds its graph) has built the graph requests use before it says ready.
WARM_UP_SENTENCES = 16


# ------------------------------------------------------------------------------------------ the engine
class Engine:
    """A loaded translator and its variants (one per set of decoding options asked for), run from one thread.

    Args:
        translator: a `keras_transformer.engines.interface.TranslatorInterface` (what `load_translator` returns).
        variants: how many variants to keep (least recently used ones go).

    Example:

    >>> engine = Engine(load_translator("saved_models/multi30k_en_de"))  # doctest: +SKIP
    >>> engine.run(("best", engine.options.replace(n_best=1), False, None), [("A dog.",)])  # doctest: +SKIP
    [[('Ein Hund.', -0.29)]]
    """

    def __init__(self, translator: TranslatorInterface, variants: int = 8) -> None:
        # a TranslatorInterface, and where its engine has them `sample`, `search_memory` and `max_target_length`
        self.translator: Any = translator
        self.options = translator.options
        self._variants: collections.OrderedDict[DecodeOptions, TranslatorInterface] = collections.OrderedDict()
        self._size = variants

    def variant(self, options: DecodeOptions) -> TranslatorInterface:
        """The translator decoding with `options` (the loaded one's `with_options`, kept for later requests)."""
        if options == self.options:
            return self.translator
        if options not in self._variants:
            while len(self._variants) >= self._size:
                self._variants.popitem(last=False)
            self._variants[options] = self.translator.with_options(options)
        self._variants.move_to_end(options)
        return self._variants[options]

    def run(self, key: tuple[str, DecodeOptions, bool, tuple[str, ...] | None],
            parts: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Decodes one batch: `key` is `Work.key`, `parts` each request's items; returns each request's results
        (`(translation, score)` per sentence for "best", a list of them for "n_best", a score for "score", a
        `details.Translation` for "details"; with terms, `(translation, score, unmet constraints)`)."""
        kind, options, prefixed, banned = key
        items = [item for part in parts for item in part]
        if not items:
            results: list[Any] = []
        elif banned is not None:  # (sentence, prefix, constraints) triples: (translation, score, unmet) results
            found = self.variant(options).translate_terms(
                [s for s, _, _ in items], [list(terms) for _, _, terms in items], list(banned) or None,
                batch_size=len(items), target_prefix=[p for _, p, _ in items] if prefixed else None,
                num_return=options.returned() if kind == "n_best" else 1)
            rows = [[(h["translation"], h["score"], h["unmet"]) for h in hypotheses] for hypotheses in found]
            results = [row[0] for row in rows] if kind == "best" else rows
        elif kind == "details":  # a `details.Translation` per sentence (documents, and lines asking for details)
            results = list(self.variant(options).translate_detailed(
                [s for s, _ in items] if prefixed else items, batch_size=len(items),
                target_prefix=[p for _, p in items] if prefixed else None))
        elif prefixed:  # (sentence, target prefix) pairs, checked when the request was read
            hypotheses = self.variant(options).n_best_lines([s for s, _ in items], batch_size=len(items),
                                                            target_prefix=[p for _, p in items])
            count = options.returned()
            results = [row[0] for row in hypotheses] if kind == "best" else [row[:count] for row in hypotheses]
        elif kind == "score":
            results = self.variant(options).score_lines([s for s, _ in items], [t for _, t in items],
                                                        batch_size=len(items))
        elif kind == "best" and options.sampling and getattr(self.translator, "engine", "") == "tensorflow":
            # The TensorFlow engine's `sample` takes the sampling settings as inputs: one graph for every seed.
            translator: Any = self.variant(dataclasses.replace(options, seed=0, top_k=0, top_p=1.0, temperature=1.0))
            outputs = translator.sample([clean_line(line).encode("utf-8") for line in items], options.seed,
                                        float(options.temperature), options.top_k, float(options.top_p))
            results = [(text.decode("utf-8", "replace"), float(score))
                       for text, score in zip(outputs["translation"].numpy(), outputs["score"].numpy())]
        else:
            hypotheses = self.variant(options).n_best_lines(items, batch_size=len(items))
            count = options.returned()
            results = [row[0] for row in hypotheses] if kind == "best" else [row[:count] for row in hypotheses]
        split, start = [], 0
        for part in parts:
            split.append(results[start:start + len(part)])
            start += len(part)
        return split

    def warm_up(self) -> None:
        """Translates `WARM_UP_SENTENCES` sentences with the default options, as requests will."""
        sentences = [f"A warm-up sentence, number {i}." for i in range(WARM_UP_SENTENCES)]
        self.run(("best", self.options.replace(n_best=1), False, None), [sentences])

    def search_memory(self, rows: int, beam: int) -> int | None:
        """Bytes the search over `rows` sentences of `beam` hypotheses holds at its longest (the translator's
        `search_memory`), or None where the engine does not say."""
        measure = getattr(self.translator, "search_memory", None)
        return measure(rows, beam) if measure is not None else None


# ------------------------------------------------------------------------------------------ counts
class Stats:
    """What the server has done: requests answered, sentences and batches decoded (with the batches' sizes),
    requests refused for a full queue (503), given up by their clients (cancelled), past their deadline (504),
    and every answer by route and status.

    Example:

    >>> stats = Stats(); stats.record(requests=3, sentences=5, seconds=0.2); stats.as_dict()["batch_sentences"]
    {'5': 1}
    """

    def __init__(self) -> None:
        self.requests = self.sentences = self.batches = 0
        self.rejected = self.cancelled = self.deadline_exceeded = 0
        self.batch_sentences: collections.Counter[int] = collections.Counter()
        self.batch_requests: collections.Counter[int] = collections.Counter()
        self.responses: collections.Counter[tuple[str, int]] = collections.Counter()  # (route, status)
        self.seconds = self.longest = 0.0

    def record(self, requests: int, sentences: int, seconds: float) -> None:
        """Counts one decoded batch of `sentences` from `requests` requests."""
        self.batches += 1
        self.sentences += sentences
        self.batch_sentences[sentences] += 1
        self.batch_requests[requests] += 1
        self.seconds += seconds
        self.longest = max(self.longest, seconds)

    def as_dict(self) -> dict[str, Any]:
        """The counts as JSON-friendly values (histogram keys are strings)."""
        responses: dict[str, dict[str, int]] = {}
        for (route, status), count in sorted(self.responses.items()):
            responses.setdefault(route, {})[str(status)] = count
        return {"requests": self.requests, "sentences": self.sentences, "batches": self.batches,
                "largest_batch": max(self.batch_sentences, default=0),
                "mean_batch": round(self.sentences / self.batches, 2) if self.batches else 0.0,
                "batch_sentences": {str(k): v for k, v in sorted(self.batch_sentences.items())},
                "batch_requests": {str(k): v for k, v in sorted(self.batch_requests.items())},
                "decoding_seconds": round(self.seconds, 3), "longest_batch_seconds": round(self.longest, 3),
                "rejected": self.rejected, "cancelled": self.cancelled,
                "deadline_exceeded": self.deadline_exceeded, "responses": responses}


# ------------------------------------------------------------------------------------------ batching
class Cancelled(Exception):
    """The request's client went away before its answer (it is not decoded further)."""


class Pending:
    """One admitted request: its engine and `Work`, the items handed to the engine so far (`taken`), the results
    back so far, its deadline (`time.monotonic()` seconds, or None) and the future its handler awaits."""

    def __init__(self, engine: Engine, work: Work, future: asyncio.Future[list[Any]], deadline: float | None) -> None:
        self.engine, self.work, self.future, self.deadline = engine, work, future, deadline
        self.arrived = time.monotonic()
        self.taken = 0
        self.results: list[Any] = []

    @property
    def key(self) -> tuple[Engine, tuple[str, DecodeOptions, bool, tuple[str, ...] | None]]:
        """What a batch shares: the engine (a model version) and `Work.key`."""
        return self.engine, self.work.key

    @property
    def left(self) -> int:
        """Items not yet handed to the engine."""
        return len(self.work.items) - self.taken


class Batcher:
    """A bounded queue of requests, decoded in batches of equal engine and `Work.key` on the engine's thread.

    Admission (`admit`): a request that would take the sentences waiting past `max_queue` is refused at once
    with 503 and `Retry-After` (how long the queue takes to drain at the recent batch time); one whose deadline
    cannot be met by that estimate gets 504. Both are counted, and neither is decoded.

    Batches: the request at the head of the queue (of another engine than the last batch's, where one waits:
    several models, or versions, take turns) decides the next batch: it waits until `max_batch` sentences
    with its key are queued or `batch_wait` seconds have passed since it arrived; the batch then takes, in queue
    order, each request's next items up to `max_batch` sentences in all. A request with items left goes to the
    back of the queue once its chunk is decoded, so a large request is decoded in chunks of at most `max_batch`
    sentences, taking turns with the others: a one-sentence request waits for at most one chunk of it. A request
    whose client has gone (`cancel`) or whose deadline has passed leaves the queue without being decoded further.
    Requests arriving while a batch decodes queue for the next. Create it inside the running event loop.
    """

    def __init__(self, engine_call: Callable[[Engine, tuple[str, DecodeOptions, bool, tuple[str, ...] | None],
                                             list[Any]], list[Any]],
                 settings: ServeSettings, stats: Stats, executor: concurrent.futures.Executor) -> None:
        self._call, self._settings, self._stats, self._executor = engine_call, settings, stats, executor
        self._pending: collections.deque[Pending] = collections.deque()
        self._wake = asyncio.Event()
        self.in_flight = 0
        self.batch_seconds: float | None = None  # recent seconds per batch (a moving average), for estimates
        self.decoding = 0  # sentences of the batch on the engine's thread
        # requests with a chunk on the engine's thread and items left: back in the queue after it
        self._parked: list[Pending] = []
        self._last_engine: Engine | None = None
        # called with (engine, sentences, requests, seconds) after each batch
        self.on_batch: Callable[[Engine, int, int, float], None] | None = None

    @property
    def queued(self) -> int:
        """Requests waiting for (more of) their sentences to be decoded."""
        return len(self._pending) + len(self._parked)

    @property
    def queued_sentences(self) -> int:
        """Sentences waiting for the engine, all requests together (what `max_queue` bounds)."""
        return sum(pending.left for pending in self._pending) + sum(pending.left for pending in self._parked)

    def drain_seconds(self, sentences: int) -> float | None:
        """How long the engine takes for `sentences` queued sentences at the recent batch time (None: not known)."""
        if self.batch_seconds is None:
            return None
        return math.ceil(sentences / self._settings.max_batch) * self.batch_seconds

    def admit(self, engine: Engine, work: Work, deadline: float | None = None) -> Pending:
        """Queues `work` for `engine`, or refuses it (503: the queue is full; 504: `deadline` cannot be met).

        Returns the `Pending` whose `future` gives the results (`wait` awaits it).
        """
        size, queued = len(work.items), self.queued_sentences
        if queued + size > self._settings.max_queue:  # type: ignore[operator]  # set by __post_init__
            self._stats.rejected += 1
            wait = self.drain_seconds(queued + self.decoding)
            retry = max(1, math.ceil(wait)) if wait is not None else 1
            raise RequestError(503, f"The server is busy: {queued} sentences are waiting and this request's "
                                    f"{size} would pass the queue's limit of {self._settings.max_queue} "
                                    f"(--max-queue); retry after {retry} s.", headers={"Retry-After": str(retry)})
        if deadline is not None:
            wait = self.drain_seconds(queued + self.decoding + size)
            if time.monotonic() >= deadline or (wait is not None and time.monotonic() + wait > deadline):
                self._stats.deadline_exceeded += 1
                raise RequestError(504, _deadline_message(wait))
        future = asyncio.get_running_loop().create_future()
        pending = Pending(engine, work, future, deadline)
        if size == 0:
            future.set_result([])
            return pending
        self._pending.append(pending)
        self._wake.set()
        return pending

    async def wait(self, pending: Pending) -> list[Any]:
        """The results of `pending` (raises its `RequestError` or the engine's error); past its deadline, 504."""
        self.in_flight += 1
        try:
            if pending.deadline is None:
                return await asyncio.shield(pending.future)
            left = pending.deadline - time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(asyncio.shield(pending.future), max(left, 0))
            if not pending.future.done():
                self._expire(pending)
            return pending.future.result()
        finally:
            self.in_flight -= 1

    async def submit(self, engine: Engine, work: Work, deadline: float | None = None) -> list[Any]:
        """`admit` then `wait`: decodes `work` with `engine` in some batch(es) and returns its results."""
        return await self.wait(self.admit(engine, work, deadline))

    def cancel(self, pending: Pending) -> None:
        """Drops `pending` (its client has gone): out of the queue, its remaining items never decoded."""
        if pending.future.done():
            return
        self._drop(pending)
        self._stats.cancelled += 1
        pending.future.set_exception(Cancelled())
        pending.future.exception()  # retrieved: nobody awaits it any more

    def _expire(self, pending: Pending) -> None:
        self._drop(pending)
        self._stats.deadline_exceeded += 1
        pending.future.set_exception(RequestError(504, _deadline_message(None, decoded=pending.taken)))

    def _drop(self, pending: Pending) -> None:
        with contextlib.suppress(ValueError):
            self._pending.remove(pending)
        with contextlib.suppress(ValueError):
            self._parked.remove(pending)

    def _head(self) -> Pending:
        """The request that decides the next batch: the oldest one, unless the last batch was its engine's (a model
        version's) and another engine has a request waiting: then the oldest of those (models take turns)."""
        for pending in self._pending:
            if pending.engine is not self._last_engine:
                return pending
        return self._pending[0]

    def _ready(self, key: tuple[Engine, tuple[str, DecodeOptions, bool, tuple[str, ...] | None]]) -> bool:
        return sum(p.left for p in self._pending if p.key == key) >= self._settings.max_batch

    def _expire_overdue(self) -> None:
        now = time.monotonic()
        for pending in [p for p in self._pending if p.deadline is not None and p.deadline <= now]:
            self._expire(pending)

    async def run(self) -> None:
        """The batching loop (a task for the server's lifetime)."""
        loop = asyncio.get_running_loop()
        limit = self._settings.max_batch
        while True:
            self._expire_overdue()
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
                self._expire_overdue()
            first = self._head()
            key = first.key
            while not self._ready(key) and first in self._pending:
                left = first.arrived + self._settings.batch_wait - time.monotonic()
                if left <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            self._expire_overdue()
            if first not in self._pending:  # cancelled or past its deadline while it waited for company
                continue
            batch, size = [], 0
            for pending in list(self._pending):
                if size >= limit:
                    break
                if pending.key != key:
                    continue
                take = min(pending.left, limit - size)
                batch.append((pending, pending.taken, pending.taken + take))
                pending.taken += take
                size += take
                self._pending.remove(pending)
                if pending.left:  # its next chunk queues again once this one is decoded, behind those queued then
                    self._parked.append(pending)
            engine = self._last_engine = key[0]
            started = time.monotonic()
            self.decoding = size
            try:
                results = await loop.run_in_executor(self._executor, self._call, engine, key[1],
                                                     [p.work.items[start:end] for p, start, end in batch])
            except Exception as error:  # every request of the batch gets the engine's message
                for pending, _, _ in batch:
                    if not pending.future.done():
                        self._drop(pending)
                        pending.future.set_exception(error)
                continue
            finally:
                self.decoding = 0
                for pending, _, _ in batch:
                    if pending in self._parked:
                        self._parked.remove(pending)
                        self._pending.append(pending)
            seconds = time.monotonic() - started
            self.batch_seconds = seconds if self.batch_seconds is None else 0.7 * self.batch_seconds + 0.3 * seconds
            self._stats.record(len(batch), size, seconds)
            if self.on_batch is not None:
                self.on_batch(engine, size, len(batch), seconds)
            log.info("batch of %d sentence(s) from %d request(s) (%s, %s) in %.3f s", size, len(batch),
                     key[1][0], key[1][1].describe(), seconds)
            for (pending, _, _), result in zip(batch, results):
                if pending.future.done():  # cancelled or past its deadline while its chunk decoded
                    continue
                pending.results.extend(result)
                if len(pending.results) == len(pending.work.items):
                    self._stats.requests += 1
                    pending.future.set_result(pending.results)


def _deadline_message(wait: float | None, decoded: int | None = None) -> str:
    if decoded is not None:
        return (f"The request's deadline passed before it was answered ({decoded} of its sentences were "
                "decoded; the rest were not).")
    estimate = f" (the queue takes about {wait:.2f} s now)" if wait is not None else ""
    return f"The request's deadline cannot be met{estimate}; it was not decoded."
