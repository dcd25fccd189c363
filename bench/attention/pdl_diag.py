"""Why did decode PDL make the engine's CUDA-graph and eager logits differ? Lockstep decode of the
small random FP8 model of tests/kernels/test_cuda_graph_gpu.py (same batch plan) with FOUR runners,
each with its own KV cache: two replay CUDA graphs (G1, G2), two run eagerly (E1, E2). Every step
compares G1 vs E1 (what the test checks), E1 vs E2 and G1 vs G2 (run-to-run determinism of one
path), as the largest |logit difference| / logit scale and the share of bitwise-equal rows.

Switches (each a fresh set of runners): decode attention PDL off / on where the KV is split
(DAYZERO_DECODE_PDL), the split-KV preset (DAYZERO_DECODE_ATTENTION), and the small-M linear's
split-K forced to one split (``triton_gemv.choose_split`` patched here, bench only): its splits
add fp32 partials with atomics in arrival order, so with more than 2 splits its sums may differ
from run to run by rounding.

    PYTHONPATH=shared:tests/kernels python3 bench/attention/pdl_diag.py   # writes $OUT/pdl-diag.json
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tests" / "kernels"))
import test_cuda_graph_gpu as t  # noqa: E402
from attn_common import run_meta  # noqa: E402

from dayzero.kernels import triton_gemv  # noqa: E402

CASES = [  # (label, DAYZERO_DECODE_PDL, DAYZERO_DECODE_ATTENTION, gemv one split)
    ("pdl off", "0", "kernel_strided_n64", False),
    ("pdl on", "1", "kernel_strided_n64", False),
    ("pdl on, v1 combine", "1", "combine", False),
    ("pdl off, gemv 1 split", "0", "kernel_strided_n64", True),
    ("pdl on, gemv 1 split", "1", "kernel_strided_n64", True),
    ("pdl on, v1 combine, gemv 1 split", "1", "combine", True),
]


def _stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """(largest |a - b| / |b|max over rows, rows bitwise equal)."""
    diff = (a - b).abs().amax(-1)
    return float((diff / b.abs().amax(-1)).max()), int((diff == 0).sum())


def lockstep(model, seed: int = 7) -> dict:
    from dayzero.runtime.model_runner import ModelRunner, SeqChunk

    kvs = [t._kv(model) for _ in range(4)]
    runners = [ModelRunner(model, kvs[i], cuda_graphs=i < 2, graph_buckets=(1, 4, 8, 16), max_model_len=t.MAX_LEN)
               if i < 2 else ModelRunner(model, kvs[i], cuda_graphs=False) for i in range(4)]
    rng = random.Random(seed)
    pos: dict[str, int] = {}
    nxt: dict[str, int] = {}
    acc = {k: [0.0, 0, 0] for k in ("graph_vs_eager", "eager_vs_eager", "graph_vs_graph")}  # worst, equal, rows

    def record(outs):
        g1, g2, e1, e2 = outs
        for key, (a, b) in (("graph_vs_eager", (g1, e1)), ("eager_vs_eager", (e2, e1)), ("graph_vs_graph", (g2, g1))):
            w, eq = _stats(a, b)
            acc[key][0] = max(acc[key][0], w)
            acc[key][1] += eq
            acc[key][2] += a.shape[0]

    plan = [(["a"], 6), (["a", "b", "c"], 6), (["a", "b", "c", "d", "e"], 6),
            ([*"abcdefghijk"], 12), ([*"kjhgfa"], 20), (["x", "y", "a"], 10)]
    for active, n_steps in plan:
        for sid in [s for s in pos if s not in active]:
            for kv in kvs:
                kv.free(sid)
            del pos[sid], nxt[sid]
        for sid in active:
            if sid not in pos:
                n = rng.choice([1, 5, 16, 17, 40, 90])
                prompt = [rng.randrange(t.CFG.vocab_size) for _ in range(n)]
                for kv in kvs:
                    kv.ensure(sid, t.MAX_LEN - 1)
                outs = [r.run([SeqChunk(sid, prompt, 0)])[0].clone() for r in runners]
                nxt[sid], pos[sid] = int(outs[2].argmax()), n
        for _ in range(n_steps):
            chunks = [SeqChunk(s, [nxt[s]], pos[s]) for s in active]
            outs = [torch.cat(r.run(chunks)).clone() for r in runners]
            record(outs)
            for s, tok in zip(active, outs[2].argmax(-1).tolist()):
                nxt[s], pos[s] = tok, pos[s] + 1
    return {k: dict(worst_rel=v[0], rows_bitwise_equal=v[1], rows=v[2]) for k, v in acc.items()}


def main() -> int:
    from dayzero.bench import random_model

    model = random_model(t.CFG, "fp8", "triton", "cuda", seed=0, max_positions=t.MAX_LEN)
    orig_split = triton_gemv.choose_split
    res = []
    only = set(filter(None, os.environ.get("PDL_DIAG_CASES", "").split(",")))
    for i, (label, pdl, preset, gemv1) in enumerate(CASES):
        if only and str(i) not in only:
            continue
        os.environ["DAYZERO_DECODE_PDL"], os.environ["DAYZERO_DECODE_ATTENTION"] = pdl, preset
        triton_gemv.choose_split = (lambda N, K, cfg: 1) if gemv1 else orig_split
        for rep in range(1):
            r = lockstep(model)
            r.update(label=label, rep=rep, pdl=pdl, preset=preset, gemv_one_split=gemv1)
            res.append(r)
            print(f"{label:<36} rep {rep}: " + " | ".join(
                f"{k} worst {v['worst_rel']:.4f} equal {v['rows_bitwise_equal']}/{v['rows']}"
                for k, v in r.items() if isinstance(v, dict)), flush=True)
    triton_gemv.choose_split = orig_split
    out = pathlib.Path(os.environ.get("OUT", "."))
    (out / "pdl-diag.json").write_text(json.dumps(dict(meta=run_meta(), results=res), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
