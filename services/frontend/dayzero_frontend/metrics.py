"""Prometheus metrics of one frontend (own registry, no process-global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class FrontendMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dayzero_frontend_requests", "HTTP API requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("dayzero_frontend_request_seconds", "Time from request to last byte",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("dayzero_frontend_time_to_first_token_seconds", "Time to the first generated token",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("dayzero_frontend_prompt_tokens", "Prompt tokens sent downstream", registry=r)
        self.completion_tokens = Counter("dayzero_frontend_completion_tokens", "Tokens generated", registry=r)
        self.harmony_anomalies = Counter(
            "dayzero_frontend_harmony_anomalies",
            "Malformed or unusual Harmony output repaired by the parser, by kind", ["kind"], registry=r)
        self.malformed_choices = Counter("dayzero_frontend_malformed_choices",
                                         "Choices whose output needed at least one Harmony repair", registry=r)
        self.client_disconnects = Counter("dayzero_frontend_client_disconnects",
                                          "Requests cancelled downstream because the client went away", registry=r)
        self.downstream_errors = Counter("dayzero_frontend_downstream_errors", "Router call failures by gRPC code",
                                         ["code"], registry=r)
        self.inflight = Gauge("dayzero_frontend_inflight_requests", "Requests being served", registry=r)

    def record_anomalies(self, kinds: list[str]) -> None:
        if not kinds:
            return
        self.malformed_choices.inc()
        for kind in kinds:
            self.harmony_anomalies.labels(kind=kind).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
