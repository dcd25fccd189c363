"""From the pods' Prometheus text to a `ClusterSample` for the planner (pure: text in, sample out).

Gauges and counters are summed over label sets within a pod (a counter under its exported
`_total` name, a histogram's sum under `_sum`); counters become rates between two scrapes of the
same pod. Latency histograms are cumulative, so the quantile of one planner interval comes from
the difference between two scrapes of the same pod (a counter reset, i.e. a restarted pod, counts
from zero), summed over pods bucket by bucket, then interpolated inside the bucket as Prometheus'
histogram_quantile does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from dayzero_router.autoscale import (
    DECODE_KV_BLOCKS_TOTAL,
    DECODE_KV_BLOCKS_USED,
    DECODE_MAX_BATCH,
    DECODE_RUNNING_REQUESTS,
    PREFILL_BUSY_SECONDS,
    PREFILL_QUEUED_TOKENS,
    ROUTER_ITL_SECONDS,
    ROUTER_TTFT_SECONDS,
    ClusterSample,
    DecodeSignals,
    PrefillSignals,
)


class MetricsFormatError(ValueError):
    """A /metrics body that is not Prometheus text."""


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts: (upper bound, observations <= bound), ascending, last is +inf."""

    buckets: tuple[tuple[float, float], ...]

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


@dataclass(frozen=True)
class PodMetrics:
    """What one pod's /metrics said."""

    pod: str
    gauges: Mapping[str, float]
    histograms: Mapping[str, Histogram]


def parse_metrics(pod: str, text: str) -> PodMetrics:
    gauges: dict[str, float] = {}
    per_le: dict[str, dict[float, float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise MetricsFormatError(f"pod {pod}: /metrics is not Prometheus text: {e}") from e
    for fam in families:
        if fam.type == "histogram":
            acc = per_le.setdefault(fam.name, {})
            for s in fam.samples:
                if s.name == fam.name + "_bucket":
                    le = float(s.labels["le"])
                    acc[le] = acc.get(le, 0.0) + s.value
                elif s.name == fam.name + "_sum":  # cumulative, like a counter
                    gauges[s.name] = gauges.get(s.name, 0.0) + s.value
        elif fam.type in ("gauge", "untyped", "counter"):
            key = fam.name + "_total" if fam.type == "counter" else fam.name
            for s in fam.samples:
                if s.name == key:
                    gauges[key] = gauges.get(key, 0.0) + s.value
    hists = {name: Histogram(tuple(sorted(acc.items()))) for name, acc in per_le.items() if acc}
    return PodMetrics(pod, gauges, hists)


def histogram_delta(new: Histogram, old: Histogram | None) -> Histogram | None:
    """Observations between two scrapes; None without a previous scrape or when bounds differ."""
    if old is None or [b for b, _ in old.buckets] != [b for b, _ in new.buckets]:
        return None
    if any(n < o for (_, n), (_, o) in zip(new.buckets, old.buckets)):
        return new  # the pod restarted: its counters began again at zero
    return Histogram(tuple((b, n - o) for (b, n), (_, o) in zip(new.buckets, old.buckets)))


def merge_histograms(hists: Sequence[Histogram]) -> Histogram | None:
    if not hists:
        return None
    bounds = [b for b, _ in hists[0].buckets]
    if any([b for b, _ in h.buckets] != bounds for h in hists):
        raise MetricsFormatError("latency histograms of different pods have different buckets")
    return Histogram(tuple((b, sum(h.buckets[i][1] for h in hists)) for i, b in enumerate(bounds)))


def histogram_quantile(q: float, h: Histogram | None) -> float | None:
    """Quantile q of a (delta) histogram; None when it holds no observation."""
    if h is None or h.count <= 0:
        return None
    rank = q * h.count
    lower, below = 0.0, 0.0
    for bound, cum in h.buckets:
        if cum >= rank:
            if math.isinf(bound):
                return lower  # beyond the last finite bucket: its bound is all that is known
            if cum == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cum - below)
        lower, below = bound, cum
    return lower


class LatencyWindow:
    """Quantile of one histogram over the interval between two `update` calls, across pods."""

    def __init__(self, name: str, quantile: float) -> None:
        self.name = name
        self.quantile = quantile
        self._previous: dict[str, Histogram] = {}

    def update(self, pods: Sequence[PodMetrics]) -> float | None:
        deltas: list[Histogram] = []
        seen: dict[str, Histogram] = {}
        for pm in pods:
            h = pm.histograms.get(self.name)
            if h is None:
                continue
            seen[pm.pod] = h
            d = histogram_delta(h, self._previous.get(pm.pod))
            if d is not None:
                deltas.append(d)
        self._previous = seen  # pods that went away are forgotten
        return histogram_quantile(self.quantile, merge_histograms(deltas))


class CounterRate:
    """Sum over pods of a counter's per-second rate between two `update` calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._previous: dict[str, tuple[float, float]] = {}

    def update(self, time: float, pods: Sequence[PodMetrics]) -> float | None:
        rates: list[float] = []
        seen: dict[str, tuple[float, float]] = {}
        for pm in pods:
            if self.name not in pm.gauges:
                continue
            value = pm.gauges[self.name]
            seen[pm.pod] = (time, value)
            prev = self._previous.get(pm.pod)
            if prev is not None and time > prev[0] and value >= prev[1]:
                rates.append((value - prev[1]) / (time - prev[0]))
        self._previous = seen
        return sum(rates) if rates else None


class SampleBuilder:
    """Keeps the latency windows between ticks and assembles each tick's `ClusterSample`."""

    def __init__(self, ttft_quantile: float, itl_quantile: float) -> None:
        self.ttft = LatencyWindow(ROUTER_TTFT_SECONDS, ttft_quantile)
        self.itl = LatencyWindow(ROUTER_ITL_SECONDS, itl_quantile)
        self.busy = CounterRate(PREFILL_BUSY_SECONDS)

    def build(self, time: float, prefill_replicas: int, decode_replicas: int,
              router: Sequence[PodMetrics], prefill: Sequence[PodMetrics],
              decode: Sequence[PodMetrics]) -> ClusterSample:
        ttft = self.ttft.update(router)
        itl = self.itl.update(router)
        pre = [p for p in prefill if PREFILL_QUEUED_TOKENS in p.gauges]
        busy = self.busy.update(time, pre)
        prefill_signals = None
        if pre:
            prefill_signals = PrefillSignals(
                ready_pods=len(pre),
                queued_tokens=sum(p.gauges[PREFILL_QUEUED_TOKENS] for p in pre),
                ttft_seconds=ttft,
                busy_pods=busy,
            )
        dec = [p for p in decode
               if DECODE_KV_BLOCKS_TOTAL in p.gauges and DECODE_KV_BLOCKS_USED in p.gauges]
        decode_signals = None
        if dec:
            batches = [p.gauges[DECODE_MAX_BATCH] for p in dec if DECODE_MAX_BATCH in p.gauges]
            decode_signals = DecodeSignals(
                ready_pods=len(dec),
                running_requests=sum(p.gauges.get(DECODE_RUNNING_REQUESTS, 0.0) for p in dec),
                kv_blocks_used=sum(p.gauges[DECODE_KV_BLOCKS_USED] for p in dec),
                kv_blocks_total=sum(p.gauges[DECODE_KV_BLOCKS_TOTAL] for p in dec),
                kv_blocks_per_pod=min(p.gauges[DECODE_KV_BLOCKS_TOTAL] for p in dec),
                max_batch_per_pod=min(batches) if len(batches) == len(dec) else None,
                itl_seconds=itl,
            )
        return ClusterSample(time, prefill_replicas, decode_replicas, prefill_signals, decode_signals)
