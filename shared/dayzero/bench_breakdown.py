"""Per-op time breakdown of one forward pass (``dayzero bench ... --breakdown``).

Every kernel-registry op call runs inside a ``torch.profiler.record_function`` range named
``op:<key>`` (``<key>`` is the op name; ``linear`` adds the weight shape). One forward is run under
``torch.profiler``; each GPU activity (kernel, memcpy, memset) is matched through its correlation id
to the runtime call that launched it, and that call's host timestamp to the innermost ``op:`` range
around it on the same thread. Per op: the summed GPU durations (what the GPU really spent, however
far the host ran ahead), the host time inside the range (profiler overhead included) and the call
count. GPU time launched outside every op range (embedding, residual adds, logits gather) is
reported as ``(outside ops)``. Where the GPU sat idle between two activities (the host had not
launched the next one yet, or waited on a sync), the gap counts as ``idle_ms`` of the op that
launched the activity ending it: the ops the GPU waits for.

Without a GPU (or when the profiler captured no GPU activity) the per-op figure is the host time of
the range, which is the compute time there because CPU ops run synchronously; ``mode`` says which.
``mode="sync"`` instead synchronizes the device around every op and times it with CUDA events (a
fallback: it includes each op's launch latency).
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
OUTSIDE = "(outside ops)"
FORWARD = "dayzero:forward"   # the profiled call's own range: lead (host before the first GPU activity) and tail
TOP_GAPS = 12


def op_key(name: str, args: tuple) -> str:
    """The breakdown key of one op call: the op name; ``linear`` adds its weight's shape (and fp8)."""
    if name == "linear" and len(args) > 1 and hasattr(args[1], "weight"):
        w = args[1].weight
        return f"linear[{w.shape[0]}x{w.shape[1]}{',fp8' if w.dtype == torch.float8_e4m3fn else ''}]"
    return name


@dataclass
class OpStat:
    gpu_ms: float = 0.0     # summed GPU activity (profile mode) / event time (sync mode) / host time (cpu)
    host_ms: float = 0.0    # host time inside the op's range (the Python call, launches included)
    calls: int = 0
    idle_ms: float = 0.0    # GPU idle right before this op's activities (profile mode)


@dataclass
class Breakdown:
    """The per-op result of one profiled forward; ``total_ms`` = sum over ops + outside ops."""

    mode: str                                   # "profiler-gpu" | "profiler-host" | "sync"
    ops: dict[str, OpStat] = field(default_factory=dict)
    outside_ms: float = 0.0                     # GPU time launched outside every op range
    outside_idle_ms: float = 0.0                # GPU idle before activities launched outside every op range
    gpu_span_ms: float = 0.0                    # first GPU activity's start to the last one's end
    wall_ms: float = 0.0                        # the profiled forward, host wall clock (device synced)
    gpu_events: int = 0
    unmatched_launches: int = 0                 # GPU events whose launch call the trace did not show
    lead_ms: float = 0.0                        # the call's start (host) to its first GPU activity
    tail_ms: float = 0.0                        # its last GPU activity's end to the call's end (host)
    gaps: list[dict] = field(default_factory=list)  # the TOP_GAPS longest idle gaps, longest first

    @property
    def ops_ms(self) -> float:
        return sum(s.gpu_ms for s in self.ops.values())

    @property
    def total_ms(self) -> float:
        return self.ops_ms + self.outside_ms

    @property
    def idle_ms(self) -> float:
        return sum(s.idle_ms for s in self.ops.values()) + self.outside_idle_ms

    def to_json(self) -> dict:
        return {k: {"gpu_ms": v.gpu_ms, "host_ms": v.host_ms, "calls": v.calls, "idle_ms": v.idle_ms}
                for k, v in self.ops.items()}

    def summary(self, untimed_ms: float | None) -> dict:
        """The check: per-op sum (+ outside) against the untimed forward of the same shape."""
        out = {"mode": self.mode, "ops_sum_ms": self.ops_ms, "outside_ops_ms": self.outside_ms,
               "total_ms": self.total_ms, "profiled_wall_ms": self.wall_ms, "gpu_events": self.gpu_events,
               "unmatched_launches": self.unmatched_launches,
               "gpu_span_ms": self.gpu_span_ms, "gpu_idle_ms": self.idle_ms, "outside_idle_ms": self.outside_idle_ms,
               "untimed_forward_ms": untimed_ms, "lead_ms": self.lead_ms, "tail_ms": self.tail_ms,
               "top_gaps": self.gaps}
        if untimed_ms:
            out["total_over_untimed"] = self.total_ms / untimed_ms
        return out


class OpProfiler:
    """Wraps ``model.ops`` for one profiled call of ``run_once``; the table is restored afterwards.

    ``mode``: "profile" (torch.profiler, GPU truth; the default) or "sync" (device sync + CUDA
    events around every op).
    """

    def __init__(self, model, mode: str = "profile") -> None:
        if mode not in ("profile", "sync"):
            raise ValueError(f"breakdown mode must be 'profile' or 'sync', not {mode!r}")
        self.model, self.mode = model, mode
        self.cuda = model.device.type == "cuda"
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event, float]] = []

    def _wrap(self, name: str, fn: Callable) -> Callable:
        from torch.profiler import record_function

        def ranged(*a, **kw):
            with record_function("op:" + op_key(name, a)):
                return fn(*a, **kw)

        def synced(*a, **kw):
            key = op_key(name, a)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            out = fn(*a, **kw)
            e1.record()
            torch.cuda.synchronize()
            self._events.append((key, e0, e1, time.perf_counter() - t0))
            return out

        return synced if (self.mode == "sync" and self.cuda) else ranged

    def run(self, run_once: Callable[[], object]) -> Breakdown:
        """Call ``run_once()`` (one forward) with every op wrapped; returns its breakdown."""
        from dayzero.kernels.registry import Ops

        orig = self.model.ops
        self.model.ops = Ops(backend=orig.backend, table={n: self._wrap(n, f) for n, f in orig.table.items()},
                             fallbacks=orig.fallbacks)
        try:
            if self.mode == "sync" and self.cuda:
                return self._run_sync(run_once)
            bd = self._run_profiled(run_once)
            if self.cuda and bd.gpu_events == 0:   # the profiler saw no GPU activity (no CUPTI?): time by syncs
                self.mode = "sync"
                self.model.ops = Ops(backend=orig.backend, fallbacks=orig.fallbacks,
                                     table={n: self._wrap(n, f) for n, f in orig.table.items()})
                bd = self._run_sync(run_once)
                bd.mode = "sync (profiler captured no GPU activity)"
            return bd
        finally:
            self.model.ops = orig

    def _run_sync(self, run_once) -> Breakdown:
        self._events.clear()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_once()
        torch.cuda.synchronize()
        bd = Breakdown(mode="sync", wall_ms=(time.perf_counter() - t0) * 1e3)
        for key, e0, e1, host in self._events:
            s = bd.ops.setdefault(key, OpStat())
            s.gpu_ms += e0.elapsed_time(e1)
            s.host_ms += host * 1e3
            s.calls += 1
        bd.ops = dict(sorted(bd.ops.items(), key=lambda kv: -kv[1].gpu_ms))
        return bd

    def _run_profiled(self, run_once) -> Breakdown:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        sync()
        from torch.profiler import record_function

        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            with record_function(FORWARD):
                run_once()
                sync()
            wall = (time.perf_counter() - t0) * 1e3
        fd, path = tempfile.mkstemp(suffix=".json", prefix="dayzero-breakdown-")
        os.close(fd)
        try:
            prof.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                trace = json.load(f)
        finally:
            os.unlink(path)
        bd = attribute(trace.get("traceEvents", []) if isinstance(trace, dict) else trace)
        bd.wall_ms = wall
        return bd


def attribute(events: list[dict]) -> Breakdown:
    """Chrome-trace events -> per-op breakdown (see the module docstring for the matching rule)."""
    ranges: dict[object, list[tuple[float, float, str]]] = defaultdict(list)   # tid -> (start, end, key)
    launches: dict[object, tuple[object, float]] = {}                          # correlation -> (tid, ts)
    gpu: list[dict] = []
    host: dict[str, OpStat] = defaultdict(OpStat)
    forward: tuple[float, float] | None = None
    ext_keys: dict[object, str] = {}                                           # External id -> op range key
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        if cat == "user_annotation" and name == FORWARD:
            forward = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        elif cat == "user_annotation" and name.startswith("op:"):
            key = name[3:]
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                ext_keys[ext] = key
            ranges[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), key))
            host[key].host_ms += float(e.get("dur", 0.0)) / 1e3
            host[key].calls += 1
        elif cat in ("cuda_runtime", "cuda_driver"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = (e.get("tid"), float(e["ts"]))
        elif cat in GPU_CATS:
            gpu.append(e)
    for lst in ranges.values():
        lst.sort()
    starts = {tid: [r[0] for r in lst] for tid, lst in ranges.items()}

    def enclosing(tid, ts: float) -> str | None:
        if tid not in ranges and len(ranges) == 1:      # launch recorded under another thread id: one host thread
            tid = next(iter(ranges))
        lst = ranges.get(tid)
        if not lst:
            return None
        i = bisect.bisect_right(starts[tid], ts) - 1
        while i >= 0:                                   # innermost: the latest start that still covers ts
            _, end, key = lst[i]
            if end >= ts:
                return key
            i -= 1
        return None

    if not gpu:                                         # no GPU activity: host time of the ranges
        ops = dict(host)
        for s in ops.values():
            s.gpu_ms = s.host_ms
        mode = "profiler-host"
        outside, unmatched = 0.0, 0
    else:
        ops = {k: OpStat(host_ms=v.host_ms, calls=v.calls) for k, v in host.items()}
        outside, outside_idle, unmatched = 0.0, 0.0, 0
        gpu.sort(key=lambda e: float(e["ts"]))
        busy_until = float(gpu[0]["ts"])                # end of the GPU's latest activity so far (us)
        gaps: list[dict] = []                           # every idle gap: before which event, after which
        prev_name = ""
        for i, e in enumerate(gpu):
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            idle = max(0.0, ts - busy_until) / 1e3
            busy_until = max(busy_until, ts + dur)
            corr = (e.get("args") or {}).get("correlation")
            if corr in launches:
                key = enclosing(*launches[corr])
            else:                       # launch not captured: the profiler's own link to a range, if any
                key = ext_keys.get((e.get("args") or {}).get("External id"))
                unmatched += 1
            if key is None:
                outside += dur / 1e3
                outside_idle += idle
            else:
                stat = ops.setdefault(key, OpStat())
                stat.gpu_ms += dur / 1e3
                stat.idle_ms += idle
            if idle > 0:
                gaps.append({"idle_us": idle * 1e3, "event": i, "op": key or OUTSIDE,
                             "after": prev_name[:60], "before": e.get("name", "")[:60]})
            prev_name = e.get("name", "")
        span = (busy_until - float(gpu[0]["ts"])) / 1e3
        top = sorted(gaps, key=lambda g: -g["idle_us"])[:TOP_GAPS]
        mode = "profiler-gpu"
    ops = dict(sorted(ops.items(), key=lambda kv: -kv[1].gpu_ms))
    bd = Breakdown(mode=mode, ops=ops, outside_ms=outside, gpu_events=len(gpu), unmatched_launches=unmatched)
    if gpu:
        bd.outside_idle_ms, bd.gpu_span_ms, bd.gaps = outside_idle, span, top
        if forward is not None:
            bd.lead_ms = max(0.0, float(gpu[0]["ts"]) - forward[0]) / 1e3
            bd.tail_ms = max(0.0, forward[1] - busy_until) / 1e3
    return bd


def print_breakdown(bd: dict | None, check: dict | None = None) -> None:
    """Print the per-op rows of ``Breakdown.to_json()`` and the sum-vs-forward check."""
    for k, v in (bd or {}).items():
        idle = f"  idle before {v['idle_ms']:8.3f} ms" if v.get("idle_ms") else ""
        print(f"  {k:40s} gpu {v['gpu_ms']:9.3f} ms  host {v['host_ms']:9.3f} ms  calls {v['calls']}{idle}")
    if check:
        unt = check.get("untimed_forward_ms")
        print(f"  per-op sum {check['ops_sum_ms']:.3f} ms + outside ops {check['outside_ops_ms']:.3f} ms = "
              f"{check['total_ms']:.3f} ms ({check['mode']}); untimed forward "
              f"{'%.3f ms' % unt if unt else 'n/a'}; profiled wall {check['profiled_wall_ms']:.3f} ms; "
              f"{check.get('gpu_events', 0)} GPU events, {check.get('unmatched_launches', 0)} without a launch record")
        if check.get("gpu_span_ms"):
            print(f"  GPU span {check['gpu_span_ms']:.3f} ms, idle inside it {check['gpu_idle_ms']:.3f} ms "
                  f"(before activities launched outside ops {check.get('outside_idle_ms', 0.0):.3f} ms); "
                  f"host lead {check.get('lead_ms', 0.0):.3f} ms, tail {check.get('tail_ms', 0.0):.3f} ms")
        for g in check.get("top_gaps") or []:
            print(f"    gap {g['idle_us']:9.1f} us before event {g['event']} ({g['op']}): {g['after']} -> {g['before']}")
