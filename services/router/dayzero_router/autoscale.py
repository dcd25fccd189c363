"""Scaling decisions for the prefill and decode stages: metric samples in, replica counts out.

Pure logic, no I/O and no clock: every sample carries its own time, so a recorded series replays
to the same decisions. `dayzero_router.planner` feeds it from the pods' /metrics and applies the
decisions to the two Deployments.

Signals (each turned into a *pressure* = observed / target; 1.0 is on target). Load signals
scale with the number of pods; latency signals do not (queueing makes them non-linear):
  prefill  load: busy fraction (time spent prefilling), queued prompt tokens per replica;
           latency: time to first token (quantile over one interval)
  decode   load: KV cache blocks in use (fraction of all pods' pools);
           latency: inter-token latency (quantile over one interval)
Rules, per stage:
  - scale up when the largest pressure exceeds 1 + tolerance: to ceil(current * pressure), at most
    max_scale_up_step more, not within scale_up_cooldown_s of the last scale-up; while pods of a
    previous scale-up are still starting, only load pressures count (latency lags the new pods);
  - scale down only while every latency pressure is <= scale_down_target, and only to a count at
    which the largest load pressure would be <= scale_down_target (hysteresis: it lands well
    below the scale-up threshold), to the highest count recommended
    over scale_down_stabilization_s, by at most max_scale_down_step, and not within
    scale_down_cooldown_s of any change (the planner's start counts as a change);
  - decode never goes below the in-flight floor: the pods needed to hold the running sequences
    and their KV blocks at inflight_fill of each pod's capacity;
  - always within [min_replicas, max_replicas]; with no data the stage holds.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

# Metric names the services export in Prometheus text on their HTTP port's /metrics (the services
# take theirs from dayzero.serving.metrics; a unit test keeps the two lists equal).
PREFILL_QUEUED_TOKENS = "dayzero_prefill_queued_tokens"  # gauge: prompt tokens waiting or being prefilled
PREFILL_COMPUTE_SECONDS = "dayzero_prefill_compute_seconds"  # histogram: prompt compute time; the rate
# of its _sum (PREFILL_BUSY_SECONDS) is the pod's busy fraction
PREFILL_BUSY_SECONDS = PREFILL_COMPUTE_SECONDS + "_sum"
DECODE_RUNNING_REQUESTS = "dayzero_decode_running_requests"  # gauge: sequences holding KV in the pod
DECODE_KV_BLOCKS_USED = "dayzero_decode_kv_blocks_used"  # gauge: blocks held by requests and leases
DECODE_KV_BLOCKS_TOTAL = "dayzero_decode_kv_blocks_total"  # gauge: blocks in the pod's pool
DECODE_MAX_BATCH = "dayzero_decode_max_batch"  # gauge (optional): --max-batch of the pod
ROUTER_TTFT_SECONDS = "dayzero_router_time_to_first_token_seconds"  # histogram: request in -> first token out
ROUTER_ITL_SECONDS = "dayzero_router_inter_token_latency_seconds"  # histogram: gap between two tokens of a stream

METRIC_NAMES = (
    PREFILL_QUEUED_TOKENS,
    PREFILL_COMPUTE_SECONDS,
    DECODE_RUNNING_REQUESTS,
    DECODE_KV_BLOCKS_USED,
    DECODE_KV_BLOCKS_TOTAL,
    DECODE_MAX_BATCH,
    ROUTER_TTFT_SECONDS,
    ROUTER_ITL_SECONDS,
)


class PolicyError(ValueError):
    """A scaling policy with inconsistent settings."""


@dataclass(frozen=True)
class StagePolicy:
    """Bounds, thresholds and timing shared by both stages."""

    min_replicas: int = 1
    max_replicas: int = 8
    tolerance: float = 0.1
    scale_down_target: float = 0.7
    scale_up_cooldown_seconds: float = 60.0
    scale_down_cooldown_seconds: float = 300.0
    scale_down_stabilization_seconds: float = 300.0
    max_scale_up_step: int = 4
    max_scale_down_step: int = 1

    def validate(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise PolicyError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, "
                              f"got {self.min_replicas}, {self.max_replicas}")
        if not 0 <= self.tolerance < 1:
            raise PolicyError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if not 0 < self.scale_down_target < 1:
            raise PolicyError(f"scale_down_target must be in (0, 1), got {self.scale_down_target}")
        if self.max_scale_up_step < 1 or self.max_scale_down_step < 1:
            raise PolicyError("max_scale_up_step and max_scale_down_step must be >= 1")
        for name in ("scale_up_cooldown_seconds", "scale_down_cooldown_seconds",
                     "scale_down_stabilization_seconds"):
            if getattr(self, name) < 0:
                raise PolicyError(f"{name} must be >= 0")


@dataclass(frozen=True)
class PrefillPolicy(StagePolicy):
    target_utilization: float = 0.7
    target_queued_tokens_per_replica: float = 32768.0
    target_ttft_seconds: float = 2.0
    ttft_quantile: float = 0.9

    def validate(self) -> None:
        super().validate()
        if self.target_queued_tokens_per_replica <= 0 or self.target_ttft_seconds <= 0:
            raise PolicyError("prefill targets must be > 0")
        if not 0 < self.target_utilization <= 1:
            raise PolicyError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if not 0 < self.ttft_quantile < 1:
            raise PolicyError(f"ttft_quantile must be in (0, 1), got {self.ttft_quantile}")


@dataclass(frozen=True)
class DecodePolicy(StagePolicy):
    target_kv_usage: float = 0.75
    target_itl_seconds: float = 0.05
    itl_quantile: float = 0.9
    inflight_fill: float = 0.9
    scale_down_cooldown_seconds: float = 600.0
    scale_down_stabilization_seconds: float = 600.0
    max_scale_up_step: int = 2

    def validate(self) -> None:
        super().validate()
        if not 0 < self.target_kv_usage <= 1 or self.target_itl_seconds <= 0:
            raise PolicyError("decode targets: 0 < target_kv_usage <= 1, target_itl_seconds > 0")
        if not 0 < self.itl_quantile < 1:
            raise PolicyError(f"itl_quantile must be in (0, 1), got {self.itl_quantile}")
        if not 0 < self.inflight_fill <= 1:
            raise PolicyError(f"inflight_fill must be in (0, 1], got {self.inflight_fill}")


@dataclass(frozen=True)
class PrefillSignals:
    """The prefill stage at one instant (sums over its ready pods)."""

    ready_pods: int
    queued_tokens: float
    ttft_seconds: float | None  # quantile over the last interval; None: no first token in it
    busy_pods: float | None = None  # sum of the pods' busy fractions over the last interval


@dataclass(frozen=True)
class DecodeSignals:
    """The decode stage at one instant (sums over its ready pods)."""

    ready_pods: int
    running_requests: float
    kv_blocks_used: float
    kv_blocks_total: float
    kv_blocks_per_pod: float  # the smallest pool among the pods
    max_batch_per_pod: float | None  # the smallest --max-batch; None when not exported
    itl_seconds: float | None  # quantile over the last interval; None: no tokens in it


@dataclass(frozen=True)
class ClusterSample:
    """One planner tick: Deployment replica counts and what the pods reported."""

    time: float  # seconds, monotonic within a series
    prefill_replicas: int  # spec.replicas of the prefill Deployment
    decode_replicas: int
    prefill: PrefillSignals | None  # None: no data (scrape failed, no pod ready)
    decode: DecodeSignals | None


@dataclass(frozen=True)
class Pressure:
    """One signal relative to its target. Load pressures fall as replicas are added."""

    name: str
    ratio: float
    is_load: bool


@dataclass(frozen=True)
class ScaleDecision:
    stage: str
    time: float
    current: int
    desired: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.desired != self.current


def prefill_pressures(s: PrefillSignals, replicas: int, p: PrefillPolicy) -> list[Pressure]:
    # Pods still starting count as capacity to come: divide by the spec, not the ready count.
    out = [Pressure("queued_tokens", s.queued_tokens / (max(replicas, 1) * p.target_queued_tokens_per_replica), True)]
    if s.busy_pods is not None:
        out.append(Pressure("utilization", s.busy_pods / (max(replicas, 1) * p.target_utilization), True))
    if s.ttft_seconds is not None:
        out.append(Pressure("ttft", s.ttft_seconds / p.target_ttft_seconds, False))
    return out


def decode_pressures(s: DecodeSignals, replicas: int, p: DecodePolicy) -> list[Pressure]:
    out = []
    if s.kv_blocks_total > 0 and s.ready_pods > 0:
        # KV use measured over the ready pods' pools, projected onto the spec's pod count.
        usage = s.kv_blocks_used / (s.kv_blocks_total / s.ready_pods * max(replicas, 1))
        out.append(Pressure("kv_usage", usage / p.target_kv_usage, True))
    if s.itl_seconds is not None:
        out.append(Pressure("itl", s.itl_seconds / p.target_itl_seconds, False))
    return out


def decode_inflight_floor(s: DecodeSignals, p: DecodePolicy) -> int:
    """Fewest decode pods that hold the running sequences and their KV blocks."""
    need = 0
    if s.kv_blocks_per_pod > 0:
        need = math.ceil(s.kv_blocks_used / (s.kv_blocks_per_pod * p.inflight_fill) - 1e-9)
    if s.max_batch_per_pod:
        need = max(need, math.ceil(s.running_requests / (s.max_batch_per_pod * p.inflight_fill) - 1e-9))
    return need


class StageScaler:
    """Replica count of one stage, tick by tick.

    State: the recommendations of the last stabilization window and the times of the last change
    and the last scale-up. `step` is deterministic in its arguments and that state.
    """

    def __init__(self, stage: str, policy: StagePolicy) -> None:
        policy.validate()
        self.stage = stage
        self.policy = policy
        self._recommendations: deque[tuple[float, int]] = deque()
        self._last_change: float | None = None
        self._last_up: float | None = None

    def step(self, time: float, current: int, ready: int, pressures: list[Pressure] | None,
             floor: int = 0) -> ScaleDecision:
        p = self.policy
        if self._last_change is None:
            self._last_change = time  # the planner's start counts as a change
        if pressures is None:
            # Without data nothing is known about the in-flight work: only lift to min_replicas.
            desired = max(current, p.min_replicas)
            return self._apply(time, current, desired, "no data: hold")
        desired, reason = self._recommend(time, current, ready, pressures)
        bounded = min(max(desired, p.min_replicas), p.max_replicas)
        if bounded != desired:
            reason += f"; bounded to [{p.min_replicas}, {p.max_replicas}]"
        if floor > bounded:
            # Grow to the floor (not past max_replicas); never shrink below it.
            lifted = max(min(floor, p.max_replicas), min(floor, current))
            if lifted != bounded:
                reason += f"; in-flight floor {floor}"
            bounded = lifted
        return self._apply(time, current, bounded, reason)

    def _apply(self, time: float, current: int, desired: int, reason: str) -> ScaleDecision:
        if desired != current:
            self._last_change = time
            if desired > current:
                self._last_up = time
        return ScaleDecision(self.stage, time, current, desired, reason)

    def _recommend(self, time: float, current: int, ready: int,
                   pressures: list[Pressure]) -> tuple[int, str]:
        p = self.policy
        worst = max(pressures, key=lambda x: x.ratio, default=None)
        ratio = worst.ratio if worst else 0.0
        # Scale-up: while new pods are still starting, latency lags them; only load counts.
        up_pressures = pressures if ready >= current else [x for x in pressures if x.is_load]
        up = max(up_pressures, key=lambda x: x.ratio, default=None)
        if up is not None and up.ratio > 1 + p.tolerance:
            want = min(max(math.ceil(max(current, 1) * up.ratio), current + 1), current + p.max_scale_up_step)
            self._remember(time, want)
            if self._last_up is not None and time - self._last_up < p.scale_up_cooldown_seconds:
                return current, f"{up.name} at {up.ratio:.2f}x target: scale-up cooldown"
            return want, f"{up.name} at {up.ratio:.2f}x target"
        # Scale-down candidate: latency comfortably low, and the count at which the worst load
        # pressure would sit at scale_down_target.
        latency = max((x for x in pressures if not x.is_load), key=lambda x: x.ratio, default=None)
        load = max((x for x in pressures if x.is_load), key=lambda x: x.ratio, default=None)
        if latency is not None and latency.ratio > p.scale_down_target:
            rec = current
        else:
            rec = min(math.ceil(current * (load.ratio if load else 0.0) / p.scale_down_target - 1e-9), current)
        self._remember(time, rec)
        stabilized = max(r for _, r in self._recommendations)
        name = worst.name if worst else "no load"
        if stabilized >= current:
            return current, f"{name} at {ratio:.2f}x target: hold"
        if time - self._last_change < p.scale_down_cooldown_seconds:
            return current, f"{name} at {ratio:.2f}x target: scale-down cooldown"
        return max(stabilized, current - p.max_scale_down_step), f"{name} at {ratio:.2f}x target: scale down"

    def _remember(self, time: float, recommendation: int) -> None:
        self._recommendations.append((time, recommendation))
        horizon = time - self.policy.scale_down_stabilization_seconds
        while self._recommendations and self._recommendations[0][0] < horizon:
            self._recommendations.popleft()


class Planner:
    """Both stages: one `ClusterSample` in, one decision per stage out."""

    def __init__(self, prefill: PrefillPolicy, decode: DecodePolicy) -> None:
        self.prefill_policy = prefill
        self.decode_policy = decode
        self.prefill = StageScaler("prefill", prefill)
        self.decode = StageScaler("decode", decode)

    def step(self, sample: ClusterSample) -> tuple[ScaleDecision, ScaleDecision]:
        t = sample.time
        if sample.prefill is None:
            pre = self.prefill.step(t, sample.prefill_replicas, 0, None)
        else:
            pre = self.prefill.step(t, sample.prefill_replicas, sample.prefill.ready_pods,
                                    prefill_pressures(sample.prefill, sample.prefill_replicas, self.prefill_policy))
        if sample.decode is None:
            dec = self.decode.step(t, sample.decode_replicas, 0, None)
        else:
            d = sample.decode
            dec = self.decode.step(t, sample.decode_replicas, d.ready_pods,
                                   decode_pressures(d, sample.decode_replicas, self.decode_policy),
                                   floor=decode_inflight_floor(d, self.decode_policy))
        return pre, dec
