"""Prometheus metrics, labelled by front door ("wyoming", "http" or "websocket"), via prometheus-client."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: First-audio buckets in seconds: the engine's first chunk is 80-300 ms on a fast GPU.
_LATENCY_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)
#: Real-time factor buckets (wall seconds per audio second; below 1 is faster than real time).
_RTF_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0, 50.0)


class Metrics:
    """The server's metrics in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tts_requests", "Speech requests by outcome (ok, error, cancelled)",
            ["door", "outcome"], registry=self.registry,
        )
        self.errors = Counter(
            "tts_errors", "Errors returned to clients, by error code", ["door", "code"],
            registry=self.registry,
        )
        self.first_audio = Histogram(
            "tts_first_audio_seconds", "Time from the request's first text to its first audio chunk (TTFA)", ["door"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.real_time_factor = Histogram(
            "tts_real_time_factor", "Wall seconds per second of audio, per request", ["door"],
            buckets=_RTF_BUCKETS, registry=self.registry,
        )
        self.queue_wait = Histogram(
            "tts_queue_wait_seconds", "Time each sentence waited from being queued to a model worker taking it; a reply's sentences are all queued when its text arrives, so a later sentence's wait includes the generation of the earlier ones", ["door"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.audio_seconds = Counter(
            "tts_audio_seconds", "Seconds of audio delivered", ["door"], registry=self.registry
        )
        self.join_stall = Histogram(
            "tts_join_stall_seconds",
            "Time running streams waited for an admission (batched engine): from its start to the "
            "next step's, GPU time on CUDA",
            # 1 ms steps up to 5 ms: the serving targets (5 ms p95 with one joiner, 10 ms with 8)
            # need that resolution; the H200 run with 5/10/20 ms buckets could not tell.
            ["model"],
            buckets=(0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0),
            registry=self.registry,
        )
        self.eager_prefill = Counter(
            "tts_prefill_eager_rows", "Requests prefilled eagerly, without a captured graph: a prompt "
            "over the largest token bucket (batched engine)", ["model"], registry=self.registry,
        )
        self._queue_depth = Gauge(
            "tts_queue_depth", "Segments waiting for a model worker", ["model"], registry=self.registry
        )

    def track_queue(self, model: str, depth: Callable[[], int]) -> None:
        """Report ``depth()`` as the queue depth of ``model`` at every scrape."""
        self._queue_depth.labels(model=model).set_function(depth)

    def exposition(self) -> bytes:
        """The text exposition format for ``GET /metrics``."""
        return generate_latest(self.registry)
