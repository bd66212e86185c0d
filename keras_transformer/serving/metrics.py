"""The server's Prometheus metrics (`GET /monitoring/prometheus/metrics`, TensorFlow Serving's path), written
with `prometheus_client` into a registry of the application's own (never the process-wide one), and the route
names they and `/stats` count answers by.

Counts (requests by route and status, sentences, refusals) are read from the server's `Stats` when the
metrics are scraped, so the two always agree; latencies and batch sizes are histograms observed as they happen.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keras_transformer.serving.batching import Stats

PREFIX = "keras_transformer_serve"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

_ROUTES = [(re.compile(r"/v1/models/[^/]+(/versions/[^/]+)?:.*"), "predict"),
           (re.compile(r"/v1/models/[^/:]+(/versions/[^/:]+)?/metadata"), "metadata"),
           (re.compile(r"/v1/models/[^/:]+(/versions/[^/:]+)?"), "model_status"),
           (re.compile(r"/translate"), "translate"), (re.compile(r"/healthz"), "healthz"),
           (re.compile(r"/readyz"), "readyz"), (re.compile(r"/stats"), "stats"),
           (re.compile(r"/monitoring/prometheus/metrics"), "metrics")]


def route_of(path: str) -> str:
    """The route a request path counts under (a few fixed names, so that labels stay few whatever is asked).

    Example:

    >>> route_of("/v1/models/en_de:predict"), route_of("/v1/models/en_de/versions/2"), route_of("/x" * 3)
    ('predict', 'model_status', 'other')
    """
    for pattern, name in _ROUTES:
        if pattern.fullmatch(path):
            return name
    return "other"


class Metrics:
    """The histograms observed as requests and batches happen, and a collector that reads the counts of `stats`
    and the state of `server` (queue depth, versions) at each scrape, all in one `CollectorRegistry`.

    Args:
        stats: the server's `batching.Stats`.
        server: an object with `batcher` (the `Batcher`, or None before it starts) and `models` (the
            `versions.ServedModel`s).
    """

    def __init__(self, stats: Stats, server: Any) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Histogram(f"{PREFIX}_request_seconds", "Seconds from a request's arrival to its answer, by "
                                 "route and HTTP status.", ["route", "status"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.batch_sentences = Histogram(f"{PREFIX}_batch_sentences", "Sentences decoded per batch.",
                                         buckets=BATCH_BUCKETS, registry=self.registry)
        self.batch_seconds = Histogram(f"{PREFIX}_batch_seconds", "Seconds the engine took per batch.",
                                       buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_Counts(stats, server))

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """One answered request's latency."""
        self.latency.labels(route=route, status=str(status)).observe(seconds)

    def observe_batch(self, sentences: int, seconds: float) -> None:
        """One decoded batch."""
        self.batch_sentences.observe(sentences)
        self.batch_seconds.observe(seconds)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format (bytes)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _Counts:
    """A `prometheus_client` collector of the server's counts, read when scraped."""

    def __init__(self, stats: Stats, server: Any) -> None:
        self.stats, self.server = stats, server

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.stats
        requests = CounterMetricFamily(f"{PREFIX}_requests", "Requests answered, by route and HTTP status "
                                       "(499: the client went away first).", labels=["route", "status"])
        for (route, status), count in sorted(stats.responses.items()):
            requests.add_metric([route, str(status)], count)
        yield requests
        for name, value, text in (
                ("sentences", stats.sentences, "Sentences (or pairs) decoded."),
                ("batches", stats.batches, "Batches decoded."),
                ("rejected", stats.rejected, "Requests refused with 503 because the queue was full."),
                ("cancelled", stats.cancelled, "Requests whose client went away before they were decoded."),
                ("deadline_exceeded", stats.deadline_exceeded, "Requests answered 504: past their deadline.")):
            yield CounterMetricFamily(f"{PREFIX}_{name}", text, value=value)
        batcher = self.server.batcher
        yield GaugeMetricFamily(f"{PREFIX}_queue_sentences", "Sentences waiting for the engine.",
                                value=batcher.queued_sentences if batcher else 0)
        yield GaugeMetricFamily(f"{PREFIX}_queue_requests", "Requests waiting for (more of) their sentences to "
                                "be decoded.", value=batcher.queued if batcher else 0)
        yield GaugeMetricFamily(f"{PREFIX}_in_flight", "Requests admitted and not yet answered.",
                                value=batcher.in_flight if batcher else 0)
        version = GaugeMetricFamily(f"{PREFIX}_model_version", "The version each model serves new requests "
                                    "with (0 while none is loaded).", labels=["model"])
        states = GaugeMetricFamily(f"{PREFIX}_model_version_state", "1 for each model version in its state "
                                   "(TensorFlow Serving's: LOADING, AVAILABLE, UNLOADING, END).",
                                   labels=["model", "version", "state"])
        for model in self.server.models:
            current = model.current
            version.add_metric([model.name], current.number if current else 0)
            for listed in model.listed():
                states.add_metric([model.name, str(listed.number), listed.state], 1)
        yield version
        yield states
