"""Prometheus text -> planner sample: the exposition is produced by the real prometheus_client (as
the services produce it), parsed back, histogram windows turned into quantiles."""

from __future__ import annotations

import random

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from dayzero_router.autoscale import (
    DECODE_KV_BLOCKS_TOTAL,
    DECODE_KV_BLOCKS_USED,
    DECODE_MAX_BATCH,
    DECODE_RUNNING_REQUESTS,
    PREFILL_COMPUTE_SECONDS,
    PREFILL_QUEUED_TOKENS,
    ROUTER_ITL_SECONDS,
    ROUTER_TTFT_SECONDS,
)
from dayzero_router.autoscale_metrics import (
    MetricsFormatError,
    SampleBuilder,
    histogram_quantile,
    parse_metrics,
)

BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


class RouterPod:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.ttft = Histogram(ROUTER_TTFT_SECONDS, "ttft", ["model"], buckets=BUCKETS, registry=self.registry)
        self.itl = Histogram(ROUTER_ITL_SECONDS, "itl", buckets=(0.01, 0.02, 0.05, 0.1, 0.2), registry=self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class PrefillPod:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.queued = Gauge(PREFILL_QUEUED_TOKENS, "queued", registry=self.registry)
        self.compute = Histogram(PREFILL_COMPUTE_SECONDS, "compute", registry=self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


class DecodePod:
    def __init__(self, used: float, total: float, running: float, max_batch: float | None):
        self.registry = CollectorRegistry()
        Gauge(DECODE_KV_BLOCKS_USED, "u", registry=self.registry).set(used)
        Gauge(DECODE_KV_BLOCKS_TOTAL, "t", registry=self.registry).set(total)
        Gauge(DECODE_RUNNING_REQUESTS, "r", registry=self.registry).set(running)
        if max_batch is not None:
            Gauge(DECODE_MAX_BATCH, "b", registry=self.registry).set(max_batch)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_quantile_of_one_interval_across_pods_tracks_the_data():
    rng = random.Random(3)
    pods = [RouterPod(), RouterPod()]
    builder = SampleBuilder(ttft_quantile=0.9, itl_quantile=0.5)
    first = builder.build(0.0, 1, 1, [parse_metrics(f"r{i}", p.text()) for i, p in enumerate(pods)], [], [])
    assert first.prefill is None and first.decode is None  # no worker reported yet
    # Old observations (before the first scrape) are huge; the window must not see them.
    for p in pods:
        for _ in range(50):
            p.ttft.labels("m").observe(15.0)
    builder.build(15.0, 1, 1, [parse_metrics(f"r{i}", p.text()) for i, p in enumerate(pods)], [], [])
    window = [rng.lognormvariate(0.0, 0.6) for _ in range(400)]
    for i, x in enumerate(window):
        pods[i % 2].ttft.labels("m" if i % 3 else "other").observe(x)
    router = [parse_metrics(f"r{i}", p.text()) for i, p in enumerate(pods)]
    got = builder.ttft.update(router)
    true = float(np.quantile(window, 0.9))
    # Interpolation inside a bucket: the estimate lies in the bucket that holds the true quantile.
    lo = max([0.0] + [b for b in BUCKETS if b < true])
    hi = min(b for b in BUCKETS if b >= true)
    assert lo <= got <= hi, (got, true)
    assert builder.ttft.update(router) is None  # nothing new since: no latency signal


def test_restarted_pod_counts_from_zero_and_new_pods_wait_one_scrape():
    a = RouterPod()
    builder = SampleBuilder(0.5, 0.5)
    for _ in range(100):
        a.ttft.labels("m").observe(3.0)
    builder.ttft.update([parse_metrics("a", a.text())])
    restarted = RouterPod()  # same pod name, counters back at zero
    for _ in range(10):
        restarted.ttft.labels("m").observe(0.07)
    newcomer = RouterPod()
    for _ in range(10):
        newcomer.ttft.labels("m").observe(9.0)
    got = builder.ttft.update([parse_metrics("a", restarted.text()), parse_metrics("b", newcomer.text())])
    assert 0.05 <= got <= 0.1  # only the restarted pod's fresh observations count


def test_sample_from_worker_metrics():
    pre = [PrefillPod(), PrefillPod()]
    pre[0].queued.set(1000)
    pre[1].queued.set(3000)
    dec = [DecodePod(300, 1000, 12, 64), DecodePod(100, 800, 4, 32)]
    builder = SampleBuilder(0.9, 0.9)
    s0 = builder.build(0.0, 3, 2, [], [parse_metrics(f"p{i}", p.text()) for i, p in enumerate(pre)],
                       [parse_metrics(f"d{i}", d.text()) for i, d in enumerate(dec)])
    assert s0.prefill.queued_tokens == 4000 and s0.prefill.ready_pods == 2
    assert s0.prefill.busy_pods is None  # a rate needs two scrapes
    assert s0.prefill_replicas == 3 and s0.decode_replicas == 2
    d = s0.decode
    assert (d.kv_blocks_used, d.kv_blocks_total, d.kv_blocks_per_pod) == (400, 1800, 800)
    assert (d.running_requests, d.max_batch_per_pod, d.itl_seconds) == (16, 32, None)
    for x in (2.0, 4.0):
        pre[0].compute.observe(x)
    pre[1].compute.observe(15.0)
    s1 = builder.build(20.0, 3, 2, [], [parse_metrics(f"p{i}", p.text()) for i, p in enumerate(pre)], [])
    assert s1.prefill.busy_pods == pytest.approx((6.0 + 15.0) / 20.0)
    assert s1.decode is None  # no decode pod answered: no data, the planner holds
    partial = builder.build(40.0, 3, 2, [], [], [parse_metrics("d0", dec[0].text()),
                                                 parse_metrics("d9", DecodePod(1, 10, 1, None).text())])
    assert partial.decode.max_batch_per_pod is None  # one pod does not say: no batch floor


def test_quantile_edge_cases():
    from dayzero_router.autoscale_metrics import Histogram as H

    assert histogram_quantile(0.9, None) is None
    assert histogram_quantile(0.9, H(((1.0, 0.0), (float("inf"), 0.0)))) is None
    assert histogram_quantile(0.5, H(((1.0, 0.0), (2.0, 0.0), (float("inf"), 10.0)))) == 2.0


def test_garbage_is_a_clear_error():
    with pytest.raises(MetricsFormatError, match="pod x"):
        parse_metrics("x", "this is { not prometheus\n")


def test_names_match_what_the_services_export():
    """The planner's constants and the services' metric names (dayzero.serving.metrics) agree."""
    served = pytest.importorskip("dayzero.serving.metrics")
    from dayzero_router import autoscale

    exported = {v for k, v in vars(served).items() if k.isupper() and isinstance(v, str) and v.startswith("dayzero_")}
    assert set(autoscale.METRIC_NAMES) <= exported, set(autoscale.METRIC_NAMES) - exported
