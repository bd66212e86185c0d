"""The engine's thread and the batches it decodes: concurrent requests asking for the same decoding are
gathered into one batch, and counted."""

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time

from keras_transformer.interface import clean_line

log = logging.getLogger("keras_transformer.serving")

# A warm-up translates this many sentences at once, so that a graph-building engine (the TensorFlow one decodes
# its first few sentences eagerly, then builds its graph) has built the graph requests use before it says ready.
WARM_UP_SENTENCES = 16


# ------------------------------------------------------------------------------------------ the engine
class Engine:
    """A loaded translator and its variants (one per set of decoding options asked for), run from one thread.

    Args:
        translator: a `keras_transformer.interface.TranslatorInterface` (what `load_translator` returns).
        variants: how many variants to keep (least recently used ones go).

    Example:

    >>> engine = Engine(load_translator("saved_models/multi30k_en_de"))  # doctest: +SKIP
    >>> engine.run(("best", engine.options.replace(n_best=1), False), [("A dog.",)])  # doctest: +SKIP
    [[('Ein Hund.', -0.29)]]
    """

    def __init__(self, translator, variants=8):
        self.translator = translator
        self.options = translator.options
        self._variants = collections.OrderedDict()
        self._size = variants

    def variant(self, options):
        """The translator decoding with `options` (the loaded one's `with_options`, kept for later requests)."""
        if options == self.options:
            return self.translator
        if options not in self._variants:
            while len(self._variants) >= self._size:
                self._variants.popitem(last=False)
            self._variants[options] = self.translator.with_options(options)
        self._variants.move_to_end(options)
        return self._variants[options]

    def run(self, key, parts):
        """Decodes one batch: `key` is `Work.key`, `parts` each request's items; returns each request's results
        (`(translation, score)` per sentence for "best", a list of them for "n_best", a score for "score")."""
        kind, options, prefixed = key
        items = [item for part in parts for item in part]
        if not items:
            results = []
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
            translator = self.variant(dataclasses.replace(options, seed=0, top_k=0, top_p=1.0, temperature=1.0))
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

    def warm_up(self):
        """Translates `WARM_UP_SENTENCES` sentences with the default options, as requests will."""
        sentences = [f"A warm-up sentence, number {i}." for i in range(WARM_UP_SENTENCES)]
        self.run(("best", self.options.replace(n_best=1), False), [sentences])


# ------------------------------------------------------------------------------------------ batching
class Stats:
    """What the server has done: requests, sentences, and the batches' sizes (sentences and requests).

    Example:

    >>> stats = Stats(); stats.record(requests=3, sentences=5, seconds=0.2); stats.as_dict()["batch_sentences"]
    {'5': 1}
    """

    def __init__(self):
        self.requests = self.sentences = self.batches = 0
        self.batch_sentences = collections.Counter()
        self.batch_requests = collections.Counter()
        self.seconds = 0.0

    def record(self, requests, sentences, seconds):
        """Counts one decoded batch."""
        self.batches += 1
        self.requests += requests
        self.sentences += sentences
        self.batch_sentences[sentences] += 1
        self.batch_requests[requests] += 1
        self.seconds += seconds

    def as_dict(self):
        """The counts as JSON-friendly values (histogram keys are strings)."""
        return {"requests": self.requests, "sentences": self.sentences, "batches": self.batches,
                "largest_batch": max(self.batch_sentences, default=0),
                "mean_batch": round(self.sentences / self.batches, 2) if self.batches else 0.0,
                "batch_sentences": {str(k): v for k, v in sorted(self.batch_sentences.items())},
                "batch_requests": {str(k): v for k, v in sorted(self.batch_requests.items())},
                "decoding_seconds": round(self.seconds, 3)}


class _Pending:
    def __init__(self, work, future):
        self.work, self.future, self.arrived = work, future, time.monotonic()


class Batcher:
    """Gathers concurrent requests into batches of equal `Work.key` and runs them on the engine's thread.

    The oldest waiting request decides the next batch: it waits until `max_batch` sentences with its key are
    queued or `batch_wait` seconds have passed since it arrived, then takes those (in arrival order, at most
    `max_batch` sentences; a larger request goes alone). Requests arriving while a batch decodes queue for the
    next. Create it inside the running event loop.
    """

    def __init__(self, engine_call, settings, stats, executor):
        self._call, self._settings, self._stats, self._executor = engine_call, settings, stats, executor
        self._pending = collections.deque()
        self._wake = asyncio.Event()
        self.in_flight = 0

    @property
    def queued(self):
        """Requests waiting for a batch."""
        return len(self._pending)

    async def submit(self, work):
        """Decodes `work` in some batch and returns its results."""
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(work, future))
        self._wake.set()
        self.in_flight += 1
        try:
            return await future
        finally:
            self.in_flight -= 1

    def _ready(self, key):
        return sum(len(p.work.items) for p in self._pending if p.work.key == key) >= self._settings.max_batch

    async def run(self):
        """The batching loop (a task for the server's lifetime)."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            first = self._pending[0]
            key = first.work.key
            while not self._ready(key):
                left = first.arrived + self._settings.batch_wait - time.monotonic()
                if left <= 0:
                    break
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            batch, size = [], 0
            for pending in list(self._pending):
                if pending.work.key != key:
                    continue
                if batch and size + len(pending.work.items) > self._settings.max_batch:
                    break
                batch.append(pending)
                size += len(pending.work.items)
                self._pending.remove(pending)
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, self._call, key,
                                                     [p.work.items for p in batch])
            except Exception as error:  # every request of the batch gets the engine's message
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                continue
            seconds = time.monotonic() - started
            self._stats.record(len(batch), size, seconds)
            log.info("batch of %d sentence(s) from %d request(s) (%s, %s) in %.3f s", size, len(batch), key[0],
                     key[1].describe(), seconds)
            for pending, result in zip(batch, results):
                if not pending.future.done():
                    pending.future.set_result(result)
