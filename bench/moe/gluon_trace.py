"""Per-tile timing of the 128-row Gluon MoE GEMM (``GluonConfig`` bm 128, kernel TRACE,
``dayzero.kernels.gluon_moe_trace``): how long full and half tiles take inside a real run, and whether a
half tile runs longer while a full tile of the same expert and N tile (the CTA streaming the same W
tile) overlaps it. GPU only; called by ``bench_gluon.py --trace-variants``.
"""

from __future__ import annotations

import statistics

import torch


def _coords(tile: int, used_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """Host copy of ``gluon_moe_gemm._tile_coords``."""
    width = group_m * num_pid_n
    first_m = (tile // width) * group_m
    gsize = min(used_m - first_m, group_m)
    return first_m + (tile % width) % gsize, (tile % width) // gsize


def _walk(tile: int, used_m: int, num_pid_n: int, group_m: int, span: list | None) -> tuple[int, int]:
    """Host copy of ``gluon_moe_gemm._tile_mn`` (span None: walk 0, else the block spans of walk 1)."""
    if span is None:
        return _coords(tile, used_m, num_pid_n, group_m)
    first, count = span[tile // num_pid_n]
    m, n = _coords(tile - first * num_pid_n, count, num_pid_n, group_m)
    return first + m, n


def _sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _med(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 2) if xs else None


def tile_times(run, stage: str) -> dict:
    """Run ``stage`` ('gate_up' | 'down') of a bm-128 ``GluonMoeRun`` once with the per-tile trace and
    summarise it: median us of full / half tiles, half tiles with and without a
    same-(expert, N tile) full tile overlapping them, the span of the launch (first tile start to last
    tile end) and the launch's CUDA-event time (the span plus the CTAs' prologue and drain; compiled
    beforehand by the run)."""
    from dayzero.kernels import gluon_moe_gemm_run as gr

    ex, al = run.experts, run.al
    N = 2 * run.I if stage == "gate_up" else run.H
    num_pid_n = -(-N // gr.BN)
    nbm = al.padded_rows // 128
    trace = torch.zeros((nbm * num_pid_n, 4), dtype=torch.int64, device=run.x.device)
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000)     # ~1 ms of GPU work ahead of ev0: the host's launch work hides behind it (run 9
    ev0.record()                     # call 1 recorded ev0 on an idle stream and timed the Python launch too)
    if stage == "gate_up":
        gr.gemm_ws(run.xq, run.xs_t, ex.gate_up, run._scales_by_k("gate_up"), ex.gate_up_bias, run.h, run.hs_t,
                   al, run.weights, K=run.H, N=N, epi=1, limit=run.limit, cfg=run.cfg, trace=trace)
    else:
        gr.gemm_ws(run.h, run.hs_t, ex.down, run._scales_by_k("down"), ex.down_bias, run.y, None, al, run.weights,
                   K=run.I, N=N, epi=2, limit=run.limit, cfg=run.cfg, trace=trace)
    ev1.record()
    torch.cuda.synchronize()
    be = al.block_expert.tolist()
    used_m = sum(1 for b in be if b >= 0)
    span = al.block_span.tolist() if run.cfg.walk else None
    recs = []                                          # (start, end, pid_m, pid_n, expert, full)
    wrong_m = 0                                        # the kernel's M block differs from the host walk's
    for tile, (t0, t1, pm, kind) in enumerate(trace.tolist()):
        if kind:
            hm, pn = _walk(tile, used_m, num_pid_n, run.cfg.group_m, span)
            wrong_m += hm != pm
            recs.append((t0, t1, pm, pn, be[pm], kind == 1))
    full = [(r[1] - r[0]) / 1e3 for r in recs if r[5]]
    half = [r for r in recs if not r[5]]
    fulls = {}
    for r in recs:
        if r[5]:
            fulls.setdefault((r[4], r[3]), []).append((r[0], r[1]))
    alone, shared = [], []
    for r in half:
        d = (r[1] - r[0]) / 1e3
        ov = any(min(r[1], f1) - max(r[0], f0) > 0.5 * (r[1] - r[0]) for f0, f1 in fulls.get((r[4], r[3]), []))
        (shared if ov else alone).append(d)
    t_all = [r[0] for r in recs] + [r[1] for r in recs]
    return {f"{stage}_trace": dict(
        tiles=len(recs), full_us=_med(full), half_us=_med([(r[1] - r[0]) / 1e3 for r in half]),
        half_with_full_overlap_us=_med(shared), half_alone_us=_med(alone),
        n_full=len(full), n_half=len(half), n_half_overlap=len(shared), walk_mismatch=wrong_m,
        unreached=used_m * num_pid_n - len(recs),
        busy_us_per_sm=round(sum((r[1] - r[0]) for r in recs) / 1e3 / _sms(), 1),
        span_us=round((max(t_all) - min(t_all)) / 1e3, 1) if t_all else None,
        launch_event_us=round(ev0.elapsed_time(ev1) * 1e3, 1))}
