"""Graph vs eager decode on the GPU, per step: the largest |logit difference| / logit scale of the
lockstep test (tests/kernels/test_cuda_graph_gpu.py) under switches, to tell which part moves the
logits: default (attention PDL off); MoE split-K decode path off; attention PDL on where the KV is
split (its old default); both.

    PYTHONPATH=shared:tests/kernels python3 bench/engine/graph_vs_eager_diag.py
"""

from __future__ import annotations

import json
import sys

import torch

sys.path.insert(0, "tests/kernels")
import test_cuda_graph_gpu as t  # noqa: E402

from dayzero.kernels import triton_attention_decode as dec  # noqa: E402
from dayzero.kernels import triton_moe_small_split as split  # noqa: E402


def run(label: str) -> dict:
    rows = []

    def compare(g, e):
        diff = (g - e).abs().amax(-1)
        scale = e.abs().amax(-1)
        rows.append(dict(B=g.shape[0], rel=(diff / scale).tolist(),
                         argmax_same=(g.argmax(-1) == e.argmax(-1)).tolist()))
        return e.argmax(-1), 0

    t._compare = compare
    t.test_lockstep_greedy_graph_vs_eager(MODEL[0])
    worst = max(max(r["rel"]) for r in rows)
    over = [(i, r["B"], [round(x, 4) for x in r["rel"]]) for i, r in enumerate(rows) if max(r["rel"]) > 0.02]
    flips = sum(not a for r in rows for a in r["argmax_same"])
    print(f"{label}: {len(rows)} compares, worst rel {worst:.4f}, over 2%: {over[:6]}, argmax flips {flips}", flush=True)
    return dict(label=label, worst=worst, over=over, flips=flips)


MODEL: list = []

if __name__ == "__main__":
    from dayzero.bench import random_model

    MODEL.append(random_model(t.CFG, "fp8", "triton", "cuda", seed=0, max_positions=t.MAX_LEN))
    out = []
    orig_cfg = dec.default_decode_config
    out.append(run("default"))
    split.DECODE_MAX_PAIRS = 0
    out.append(run("moe split-K off"))
    split.DECODE_MAX_PAIRS = 256
    dec.default_decode_config = lambda *a, **k: dict(orig_cfg(*a, **k), PDL=None)
    out.append(run("attention PDL on when split"))
    split.DECODE_MAX_PAIRS = 0
    out.append(run("PDL on, split-K off"))
    print(json.dumps(out))
