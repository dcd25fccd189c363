"""Where the decode-MoE wg layer's time goes (diagnostic): every program of the shipped wg tiles writes its start,
end, SM and (down) PDL-wait-return %globaltimer stamps (``triton_moe_small_wg`` ``TRACE``), inside the same CUDA
graph of R back-to-back calls that ``bench_small.py`` times. Per call it reports the gate_up and down spans, the
gap between them, each kernel's program durations (p10 / p50 / p90 / max), its start skew, its tail (last end
minus the 90th percentile end) and the programs per SM; beside it the untraced graph time of the same calls.

    PYTHONPATH=shared python3 bench/moe/wg_trace.py --out DIR [--models 20b,120b] [--ts 1,2,4]

Writes DIR/wg-trace.json (rows; meta: commit, GPU, date).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_small import H, I, LIMIT, routings  # noqa: E402
from common import Results, graph_us, random_experts  # noqa: E402

from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit, default_tiles  # noqa: E402

EXPERTS = {"20b": 32, "120b": 128}


def pct(v: list, q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]


def kernel_stats(tr: torch.Tensor) -> dict:
    """tr [programs, 4] int64 (start, end, sm, wait) -> spans and percentiles in us (programs that ran to the
    end only: a program of a pair routed elsewhere stops early and writes no end)."""
    rows = [r for r in tr.tolist() if r[0] > 0 and r[1] >= r[0]]
    if not rows:
        return dict(programs=0)
    t0 = min(r[0] for r in rows)
    dur = [(r[1] - r[0]) / 1e3 for r in rows]
    ends = [(r[1] - t0) / 1e3 for r in rows]
    starts = [(r[0] - t0) / 1e3 for r in rows]
    per_sm: dict = {}
    for r in rows:
        per_sm[r[2]] = per_sm.get(r[2], 0) + 1
    return dict(programs=len(rows), t0=t0, t_end=max(r[1] for r in rows), span_us=max(ends),
                dur_p10=pct(dur, 0.1), dur_p50=pct(dur, 0.5), dur_p90=pct(dur, 0.9), dur_max=max(dur),
                start_p90_us=pct(starts, 0.9), start_max_us=max(starts), tail_us=max(ends) - pct(ends, 0.9),
                sms=len(per_sm), per_sm_max=max(per_sm.values()), per_sm_min=min(per_sm.values()),
                wait_min=min((r[3] for r in rows if r[3] > 0), default=0),
                wait_p50_us=pct([(r[3] - r[0]) / 1e3 for r in rows if r[3] > 0] or [0.0], 0.5))


def one_case(res: Results, name: str, T: int, tile_name: str = "") -> None:
    """One model and token count on its shipped tiles (or ``tile_name``'s, a per-pair wg variant): untraced, then
    traced, graph times and the stamps."""
    E = EXPERTS[name]
    ex = random_experts(E, H, I, seed=3)
    g = torch.Generator(device="cuda").manual_seed(11)
    tiles = VARIANTS[tile_name] if tile_name else default_tiles(T * 4, E)
    calls = []
    for w, ids in routings(T, E, seed=7):
        x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
        calls.append(MoeSplit(x, w, ids, ex, LIMIT, tiles))
    plain_us = graph_us(calls)
    ref = [c().clone() for c in calls]
    for c in calls:   # the same calls traced: one buffer per kernel and call
        c.trace = (torch.zeros((c.P * c.nt1, 4), dtype=torch.int64, device="cuda"),
                   torch.zeros((c.P * c.nt2 * c.s2, 4), dtype=torch.int64, device="cuda"))
    traced_us = graph_us(calls)   # warms up, captures, replays: the buffers hold the last replay's stamps
    torch.cuda.synchronize()
    same = all(torch.equal(c.out, r) for c, r in zip(calls, ref))
    rows = []
    for r, c in enumerate(calls):
        gu, dn = kernel_stats(c.trace[0].cpu()), kernel_stats(c.trace[1].cpu())
        if not gu.get("programs") or not dn.get("programs"):
            continue
        rows.append(dict(call=r, gate_up=gu, down=dn, total_us=(dn["t_end"] - gu["t0"]) / 1e3,
                         gap_start_us=(dn["t0"] - gu["t_end"]) / 1e3,
                         gap_wait_us=((dn["wait_min"] - gu["t_end"]) / 1e3) if dn["wait_min"] else None))
    med = {k: statistics.median(r[k] for r in rows) for k in ("total_us", "gap_start_us")}
    for stage in ("gate_up", "down"):
        for k in ("span_us", "dur_p10", "dur_p50", "dur_p90", "dur_max", "start_p90_us", "tail_us", "per_sm_max",
                  "wait_p50_us"):
            med[f"{stage}_{k}"] = statistics.median(r[stage][k] for r in rows)
    tile = next(n for n, v in VARIANTS.items() if v is tiles)
    res.add(section="wg_trace", model=name, E=E, T=T, tiles=tile, plain_us=plain_us, traced_us=traced_us,
            traced_output_equal=same, calls=len(rows), median=med, rows=rows)
    print(f"wg_trace {name} T={T} {tile}: graph {plain_us:.1f} us (traced {traced_us:.1f}, output equal {same}); "
          f"per call {med['total_us']:.1f} us = gate_up span {med['gate_up_span_us']:.1f} (programs p50 "
          f"{med['gate_up_dur_p50']:.1f} / p90 {med['gate_up_dur_p90']:.1f} / max {med['gate_up_dur_max']:.1f}, start "
          f"p90 {med['gate_up_start_p90_us']:.1f}, tail {med['gate_up_tail_us']:.1f}, <= {med['gate_up_per_sm_max']:.0f}"
          f" per SM) | down start {med['gap_start_us']:+.1f} after gate_up's end, span {med['down_span_us']:.1f} "
          f"(p50 {med['down_dur_p50']:.1f} / p90 {med['down_dur_p90']:.1f} / max {med['down_dur_max']:.1f}, tail "
          f"{med['down_tail_us']:.1f}, <= {med['down_per_sm_max']:.0f} per SM, wait p50 {med['down_wait_p50_us']:.1f} "
          f"after start)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="20b,120b")
    ap.add_argument("--ts", default="1,2,4")
    ap.add_argument("--tiles", default="", help="VARIANTS names (per-pair wg tiles) traced at each T too")
    a = ap.parse_args()
    res = Results("wg-trace")
    for name in a.models.split(","):
        for T in (int(t) for t in a.ts.split(",")):
            for tile in filter(None, a.tiles.split(",")):
                if VARIANTS[tile].gemv_max_t >= T:
                    res.section(f"wg_trace {name} T={T} {tile}", one_case, name, T, tile)
            if not default_tiles(T * 4, EXPERTS[name]).wg or default_tiles(T * 4, EXPERTS[name]).wg_slots:
                print(f"wg_trace {name} T={T}: the shipped tiles there are not the per-pair wg kernels; skipped")
                continue
            res.section(f"wg_trace {name} T={T}", one_case, name, T)
    print("wrote", res.write(a.out), "errors:", len(res.errors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
