"""Where the one-launch T = 1 decode MoE's time goes (diagnostic): every CTA of ``gluon_moe_stream`` (``TRACE``)
writes its start / loop-start / loop-end %globaltimer stamps, the %clock64 cycles its step loop spent in each
section (down chunk: poll the gate_up parts + h rows; ring-slot wait; wgmma + fold; refill) and the ns of its
tail (output tiles it sums + the done count), inside the same CUDA graph of back-to-back calls that ``bench_small.py`` times. Reports per
call the span, the CTAs' start skew and prologue, and each section's share of the loop (median over CTAs and
calls), beside the untraced graph time.

    PYTHONPATH=shared python3 bench/moe/stream_trace.py --out DIR [--models 20b,120b] [--variants gx_s20]

Writes DIR/stream-trace.json (rows; meta: commit, GPU, date).
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

from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit  # noqa: E402

EXPERTS = {"20b": 32, "120b": 128}
SECTIONS = ("chunk", "ready", "mma", "refill")


def one_case(res: Results, name: str, variant: str) -> None:
    E = EXPERTS[name]
    ex = random_experts(E, H, I, seed=3)
    g = torch.Generator(device="cuda").manual_seed(11)
    calls = []
    for w, ids in routings(1, E, seed=7):
        x = torch.randn(1, H, device="cuda", generator=g).bfloat16()
        calls.append(MoeSplit(x, w, ids, ex, LIMIT, VARIANTS[variant]))
    if calls[0].stream is None:
        print(f"stream_trace {name} {variant}: the stream kernel does not apply here; skipped")
        return
    plain_us = graph_us(calls)
    ref = [c().clone() for c in calls]
    for c in calls:
        c.trace = torch.zeros((c.grid_ctas, 8), dtype=torch.int64, device="cuda")
    traced_us = graph_us(calls)
    torch.cuda.synchronize()
    same = all(torch.equal(c.out, r) for c, r in zip(calls, ref))
    rows = []
    for r, c in enumerate(calls):
        t = c.trace.cpu().tolist()
        t0 = min(v[0] for v in t)
        cyc = [sum(v[3:7]) for v in t]
        loop_ns = [v[2] - v[1] for v in t]
        mhz = statistics.median(cy / max(ns, 1) * 1e3 for cy, ns in zip(cyc, loop_ns))
        rows.append(dict(call=r, span_us=(max(v[2] + v[7] for v in t) - t0) / 1e3,
                         tail_us=statistics.median(v[7] / 1e3 for v in t), tail_us_max=max(v[7] for v in t) / 1e3,
                         start_skew_us=(max(v[0] for v in t) - t0) / 1e3,
                         prologue_us=statistics.median((v[1] - v[0]) / 1e3 for v in t),
                         loop_us_p50=statistics.median(ns / 1e3 for ns in loop_ns), loop_us_max=max(loop_ns) / 1e3,
                         loop_end_spread_us=(max(v[2] for v in t) - min(v[2] for v in t)) / 1e3, clock_mhz=mhz,
                         **{f"{s}_us": statistics.median(v[3 + i] for v in t) / mhz for i, s in enumerate(SECTIONS)},
                         **{f"{s}_us_max": max(v[3 + i] for v in t) / mhz for i, s in enumerate(SECTIONS)}))
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "call"}
    res.add(section="stream_trace", model=name, E=E, variant=variant, plain_us=plain_us, traced_us=traced_us,
            traced_output_equal=same, median=med, rows=rows)
    print(f"stream_trace {name} {variant}: graph {plain_us:.1f} us (traced {traced_us:.1f}, output equal {same}); "
          f"span {med['span_us']:.1f}, start skew {med['start_skew_us']:.1f}, prologue {med['prologue_us']:.1f}, "
          f"loop p50 {med['loop_us_p50']:.1f} / max {med['loop_us_max']:.1f}, loop ends spread "
          f"{med['loop_end_spread_us']:.1f}, tail p50 {med['tail_us']:.1f} / max {med['tail_us_max']:.1f}; "
          "loop sections (median CTA / max CTA, us): " +
          ", ".join(f"{s} {med[f'{s}_us']:.1f} / {med[f'{s}_us_max']:.1f}" for s in SECTIONS) +
          f" at {med['clock_mhz']:.0f} MHz", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="20b,120b")
    ap.add_argument("--variants", default="gx1_s20,gx2_s8,gx3_s4")
    a = ap.parse_args()
    res = Results("stream-trace")
    for name in a.models.split(","):
        for v in a.variants.split(","):
            res.section(f"stream_trace {name} {v}", one_case, name, v)
    print("wrote", res.write(a.out), "errors:", len(res.errors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
