"""Prometheus metric names exported by the router, prefill and decode services.

Names are part of the deployment contract (the Helm chart's planner and dashboards read them).
Each service builds its metrics on its own ``CollectorRegistry`` (no module-global state).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# router
ROUTER_REQUESTS = "dayzero_router_requests"                      # counter {outcome, route}
ROUTER_TTFT = "dayzero_router_time_to_first_token_seconds"       # histogram {route}
ROUTER_ITL = "dayzero_router_inter_token_latency_seconds"        # histogram
ROUTER_INFLIGHT = "dayzero_router_inflight_requests"             # gauge
ROUTER_WORKERS = "dayzero_router_workers"                        # gauge {role}
# prefill
PREFILL_QUEUED_TOKENS = "dayzero_prefill_queued_tokens"          # gauge: prompt tokens waiting or being prefilled
PREFILL_QUEUE_LENGTH = "dayzero_prefill_queue_length"            # gauge: requests waiting or running
PREFILL_REQUESTS = "dayzero_prefill_requests"                    # counter {outcome}
PREFILL_SECONDS = "dayzero_prefill_compute_seconds"              # histogram
PREFILL_QUEUE_SECONDS = "dayzero_prefill_queue_seconds"          # histogram
# KV transfer (prefill side = sender)
KV_TRANSFER_SECONDS = "dayzero_kv_transfer_seconds"              # histogram {transport}
KV_TRANSFER_BYTES = "dayzero_kv_transfer_bytes"                  # counter {transport}
KV_TRANSFER_FAILURES = "dayzero_kv_transfer_failures"            # counter {transport, reason}
# decode
DECODE_RUNNING = "dayzero_decode_running_requests"               # gauge: sequences holding KV
DECODE_WAITING = "dayzero_decode_waiting_requests"               # gauge: queued in the engine
DECODE_QUEUED_TOKENS = "dayzero_decode_queued_tokens"            # gauge: prompt tokens queued locally
DECODE_KV_USED = "dayzero_decode_kv_blocks_used"                 # gauge: blocks held by requests and leases
DECODE_KV_FREE = "dayzero_decode_kv_blocks_free"                 # gauge
DECODE_KV_TOTAL = "dayzero_decode_kv_blocks_total"               # gauge
DECODE_KV_USAGE = "dayzero_decode_kv_usage_ratio"                # gauge: used / total
DECODE_MAX_BATCH = "dayzero_decode_max_batch"                    # gauge: --max-batch
DECODE_LEASES = "dayzero_decode_open_leases"                     # gauge
DECODE_LEASES_EXPIRED = "dayzero_decode_leases_expired"          # counter
DECODE_KV_WAIT = "dayzero_decode_kv_wait_seconds"                # histogram: Generate waiting for the KV to land
DECODE_TTFT = "dayzero_decode_time_to_first_token_seconds"       # histogram {route}
DECODE_ITL = "dayzero_decode_inter_token_latency_seconds"        # histogram
DECODE_REQUESTS = "dayzero_decode_requests"                      # counter {outcome, route}
DECODE_STEP_SECONDS = "dayzero_decode_step_seconds"              # histogram: one engine step


@dataclass
class RouterMetrics:
    registry: CollectorRegistry
    requests: Counter
    ttft: Histogram
    itl: Histogram
    inflight: Gauge
    workers: Gauge

    @classmethod
    def create(cls) -> "RouterMetrics":
        r = CollectorRegistry()
        return cls(r, Counter(ROUTER_REQUESTS, "requests by outcome and route", ["outcome", "route"], registry=r),
                   Histogram(ROUTER_TTFT, "request in -> first token out", ["route"], buckets=LATENCY_BUCKETS, registry=r),
                   Histogram(ROUTER_ITL, "gap between two tokens of a stream", buckets=ITL_BUCKETS, registry=r),
                   Gauge(ROUTER_INFLIGHT, "requests in flight", registry=r),
                   Gauge(ROUTER_WORKERS, "live workers in the registry", ["role"], registry=r))


@dataclass
class PrefillMetrics:
    registry: CollectorRegistry
    queued_tokens: Gauge
    queue_length: Gauge
    requests: Counter
    compute: Histogram
    queue_wait: Histogram
    kv_seconds: Histogram
    kv_bytes: Counter
    kv_failures: Counter

    @classmethod
    def create(cls) -> "PrefillMetrics":
        r = CollectorRegistry()
        return cls(r, Gauge(PREFILL_QUEUED_TOKENS, "prompt tokens waiting or being prefilled", registry=r),
                   Gauge(PREFILL_QUEUE_LENGTH, "prefill requests waiting or running", registry=r),
                   Counter(PREFILL_REQUESTS, "prefill requests by outcome", ["outcome"], registry=r),
                   Histogram(PREFILL_SECONDS, "prompt compute time", buckets=LATENCY_BUCKETS, registry=r),
                   Histogram(PREFILL_QUEUE_SECONDS, "time waiting in the prefill queue", buckets=LATENCY_BUCKETS, registry=r),
                   Histogram(KV_TRANSFER_SECONDS, "KV handoff time", ["transport"], buckets=LATENCY_BUCKETS, registry=r),
                   Counter(KV_TRANSFER_BYTES, "KV bytes handed off", ["transport"], registry=r),
                   Counter(KV_TRANSFER_FAILURES, "failed KV handoffs", ["transport", "reason"], registry=r))


@dataclass
class DecodeMetrics:
    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    queued_tokens: Gauge
    kv_used: Gauge
    kv_free: Gauge
    kv_total: Gauge
    kv_usage: Gauge
    max_batch: Gauge
    leases: Gauge
    leases_expired: Counter
    kv_wait: Histogram
    ttft: Histogram
    itl: Histogram
    requests: Counter
    step: Histogram

    @classmethod
    def create(cls) -> "DecodeMetrics":
        r = CollectorRegistry()
        return cls(r, Gauge(DECODE_RUNNING, "sequences holding KV and decoding", registry=r),
                   Gauge(DECODE_WAITING, "requests queued in the engine", registry=r),
                   Gauge(DECODE_QUEUED_TOKENS, "prompt tokens queued in the engine", registry=r),
                   Gauge(DECODE_KV_USED, "KV blocks held by requests and leases", registry=r),
                   Gauge(DECODE_KV_FREE, "free KV blocks", registry=r),
                   Gauge(DECODE_KV_TOTAL, "KV blocks in the pools", registry=r),
                   Gauge(DECODE_KV_USAGE, "KV blocks used / total", registry=r),
                   Gauge(DECODE_MAX_BATCH, "maximum running requests (--max-batch)", registry=r),
                   Gauge(DECODE_LEASES, "KV leases not yet consumed", registry=r),
                   Counter(DECODE_LEASES_EXPIRED, "leases freed because their KV never came or was never used", registry=r),
                   Histogram(DECODE_KV_WAIT, "Generate waiting for the KV to land", buckets=LATENCY_BUCKETS, registry=r),
                   Histogram(DECODE_TTFT, "Generate in -> first token out", ["route"], buckets=LATENCY_BUCKETS, registry=r),
                   Histogram(DECODE_ITL, "gap between two tokens of a sequence", buckets=ITL_BUCKETS, registry=r),
                   Counter(DECODE_REQUESTS, "decode requests by outcome and route", ["outcome", "route"], registry=r),
                   Histogram(DECODE_STEP_SECONDS, "one engine step", buckets=ITL_BUCKETS, registry=r))
