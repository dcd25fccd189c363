"""Diagnostic: the one-launch T = 1 decode MoE (``gluon_moe_stream``) on an expert-parallel slice (experts 8..15
of 16, routes [9, 1, 14, 3] / [0, 1, 2, 3]) with a watchdog: if the call has not finished after a few seconds,
the control words and the tagged part words are copied out on a side stream (DMA) and the parts that never
got this call's tag are listed by (stage, pair, tile, part), then the process exits (a spinning kernel cannot
be stopped from the host).

    PYTHONPATH=shared python3 bench/moe/stream_ep_probe.py [--variant gx2_s8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_small import H, I, LIMIT  # noqa: E402
from common import random_experts  # noqa: E402

from dayzero.kernels.triton_moe_small_split import VARIANTS, MoeSplit  # noqa: E402
from dayzero.kernels.types import ExpertWeights  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="gx2_s8")
    ap.add_argument("--wait-s", type=float, default=5.0)
    ap.add_argument("--ids", default="9,1,14,3;0,1,2,3;9,10,14,11", help="routes per call, ';' between calls")
    a = ap.parse_args()
    full = random_experts(16, H, I, seed=3)
    sl = slice(8, 16)
    ex = ExpertWeights(full.gate_up[sl], full.gate_up_bias[sl], full.down[sl], full.down_bias[sl],
                       full.gate_up_scale[sl], full.down_scale[sl], derived={"expert_offset": 8})
    x = torch.randn(1, H, device="cuda").bfloat16()
    w = torch.full((1, 4), 0.25, device="cuda").bfloat16()
    for ids_l in ([int(v) for v in c.split(",")] for c in a.ids.split(";")):
        ids = torch.tensor([ids_l], device="cuda")
        run = MoeSplit(x, w, ids, ex, LIMIT, VARIANTS[a.variant])
        print(f"ids {ids_l}: stream {run.stream}", flush=True)
        run()
        t0 = time.time()
        while not torch.cuda.current_stream().query() and time.time() - t0 < a.wait_s:
            time.sleep(0.01)
        if torch.cuda.current_stream().query():
            print(f"ids {ids_l}: done in {time.time() - t0:.3f} s, out finite {bool(torch.isfinite(run.out).all())}, "
                  f"ctrl {ex.derived['moe_stream_ctrl'].tolist()}", flush=True)
            continue
        side = torch.cuda.Stream()
        key = next(k for k in ex.derived if k.startswith("moe_stream_words"))
        ctrl = torch.empty(ex.derived["moe_stream_ctrl"].shape, dtype=torch.int32).pin_memory()
        words = torch.empty(ex.derived[key].shape, dtype=torch.int64).pin_memory()
        with torch.cuda.stream(side):   # pinned: a true DMA, beside the spinning kernel
            ctrl.copy_(ex.derived["moe_stream_ctrl"], non_blocking=True)
            words.copy_(ex.derived[key], non_blocking=True)
        t1 = time.time()
        while not side.query() and time.time() - t1 < 5:
            time.sleep(0.01)
        print(f"ids {ids_l}: HUNG; side copy done {side.query()}; ctrl {ctrl.tolist()}; {key}", flush=True)
        if side.query():
            sh = run.stream
            P, NT1, NT2, M1, M2 = run.P, sh["NT1"], sh["NT2"], sh["MAXP1"], sh["MAXP2"]
            tag = ctrl[1].item() % 0x7FFFFFFF + 1
            gw = (words[: P * NT1 * M1 * 64].view(P, NT1, M1, 64) >> 32)
            dw = (words[P * NT1 * M1 * 64:].view(P, NT2, M2, 64) >> 32)
            for name, t in (("gate_up", gw), ("down", dw)):
                full_ok = (t == tag).all(-1)
                print(f"  {name}: tag {tag}; words with it per (pair): {(t == tag).sum((1, 2, 3)).tolist()}; "
                      f"(pair, tile, part) fully tagged per pair: {full_ok.sum((1, 2)).tolist()}", flush=True)
        os._exit(3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
