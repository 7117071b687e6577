"""Prometheus metrics of one `fastbert serve` app, in a registry of its own (two apps in one process,
as in the tests, do not share counters). Served as text at GET /metrics."""
from __future__ import annotations

# seconds: from a fraction of a millisecond (tokenizing one short text) to a long queue wait
_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("fastbert_requests", "HTTP requests answered, by route and status code",
                                ("route", "status"), registry=r)
        self.in_flight = Gauge("fastbert_requests_in_flight", "requests accepted and not yet answered", registry=r)
        self.queue_size = Gauge("fastbert_queue_size", "inputs waiting for a batch", registry=r)
        self.queue_time = Histogram("fastbert_queue_seconds", "time an input waits for its batch", registry=r,
                                    buckets=_TIME_BUCKETS)
        self.tokenize_time = Histogram("fastbert_tokenize_seconds", "tokenization time per request",
                                       registry=r, buckets=_TIME_BUCKETS)
        self.inference_time = Histogram("fastbert_inference_seconds", "model time per batch", registry=r,
                                        buckets=_TIME_BUCKETS)
        self.batch_tokens = Histogram("fastbert_batch_tokens", "tokens per batch (padded rows count "
                                      "their padding)", registry=r, buckets=_TOKEN_BUCKETS)
        self.batch_inputs = Histogram("fastbert_batch_inputs", "inputs per batch", registry=r,
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))

    def render(self) -> tuple:
        """(body bytes, content type) of the text exposition format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
