"""Small-M dense FP8 linear (decode) on the GPU, timed the way the engine runs it: inside a CUDA
graph, on enough weight copies that each call streams its weight from HBM (not L2).

``--sweep modes`` (default): ``gemv_fp8``'s product modes (bf16 shipped, dot16, swap; session 7) and a few tiles on
the engine's decode calls at M = 1, 4, 16: the stacked qkv, q and k/v with fp8 x (1x128 scales, as rms_norm_quant
hands them), o and lm_head with bf16 x. ``--sweep tiles``: the session-2 sweep (bf16 x only) beside the older
weight-only kernel (``gemm_w8a16_triton``). Bandwidth counts the FP8 weight + scales. Writes $OUT/linear-gemv.json.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "moe"))
from common import COPY_TBS, Results, graph_us, random_linear  # noqa: E402

from dayzero.kernels.triton_gemv import GemvConfig, choose_split, gemv_fp8  # noqa: E402
from dayzero.kernels.triton_linear import _split_for, gemm_w8a16_triton  # noqa: E402

SHAPES = {"q": (4096, 2880), "kv": (512, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}
# (N, K, x dtype) of the engine's decode calls (qkv: q, k and v stacked)
CALLS = {"qkv": (5120, 2880, "fp8"), "q": (4096, 2880, "fp8"), "kv": (512, 2880, "fp8"), "o": (2880, 4096, "bf16"),
         "lm_head": (201088, 2880, "bf16")}
MODE_CONFIGS = [GemvConfig(mode="bf16"), GemvConfig(mode="dot16"), GemvConfig(mode="swap"),
                GemvConfig(mode="swap", bn=128), GemvConfig(mode="swap", target_programs=528)]
L2_BYTES = 60 << 20


def run_shape(res: Results, name: str, m_list: list[int], configs: list[GemvConfig]) -> None:
    n, k = SHAPES[name]
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128))
    copies = max(2, min(16, -(-3 * L2_BYTES // nbytes)))
    weights = [random_linear(n, k, seed=i) for i in range(copies)]
    for m in m_list:
        x = torch.randn(m, k, device="cuda").bfloat16()
        ref = x.float() @ (weights[0].weight.float() * weights[0].scale.repeat_interleave(128, 0)
                           .repeat_interleave(128, 1)[:n, :k]).t() + weights[0].bias.float()
        variants = [("w8a16 bn64", lambda i: gemm_w8a16_triton(x, weights[i])),
                    ("w8a16 bn64 split-auto (2 launches)",
                     lambda i: gemm_w8a16_triton(x, weights[i], split_k=_split_for(m, n, k, 16, 64)))]
        for cfg in configs:
            variants.append((f"gemv bn{cfg.bn} split{choose_split(n, k, cfg)} w{cfg.warps} s{cfg.stages}",
                             lambda i, cfg=cfg: gemv_fp8(x, weights[i], cfg)))
        for label, fn in variants:
            try:
                err = ((fn(0).float() - ref).norm() / ref.norm()).item()
                us = graph_us([lambda i=i, fn=fn: fn(i) for i in range(copies)])
                res.add(shape=name, m=m, n=n, k=k, kernel=label, us=round(us, 2),
                        tbs=round(nbytes / us / 1e6, 3), pct_copy=round(100 * nbytes / us / 1e6 / COPY_TBS, 1),
                        rel_err=round(err, 5))
            except Exception as exc:  # one config failing (e.g. ptxas) must not end the sweep
                res.add(shape=name, m=m, kernel=label, error=repr(exc)[:300])
    del weights
    torch.cuda.empty_cache()


def run_call(res: Results, name: str, m_list: list[int], configs: list[GemvConfig]) -> None:
    """One decode call's shape with its x dtype, every config on the same weights and inputs."""
    from dayzero.weights import fp8

    n, k, xkind = CALLS[name]
    nbytes = n * k + 4 * (-(-n // 128)) * (-(-k // 128))
    copies = max(2, min(16, -(-3 * L2_BYTES // nbytes)))
    weights = [random_linear(n, k, seed=i) for i in range(copies)]
    w0 = weights[0].weight.float() * weights[0].scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    for m in m_list:
        x = torch.randn(m, k, device=weights[0].weight.device)
        xs = None
        if xkind == "fp8":
            x, xs = fp8.quantize_act_group(x)
            xd = fp8.dequantize_act_group(x, xs)
        else:
            x = x.bfloat16()
            xd = x.float()
        ref = xd @ w0.t() + weights[0].bias.float()
        for cfg in configs:
            label = f"gemv {cfg.mode} bn{cfg.bn} split{choose_split(n, k, cfg)} w{cfg.warps} s{cfg.stages}"
            try:
                fn = (lambda i, cfg=cfg: gemv_fp8(x, weights[i], cfg, x_scale=xs))
                err = ((fn(0).float() - ref).norm() / ref.norm()).item()
                us = graph_us([lambda i=i, fn=fn: fn(i) for i in range(copies)])
                res.add(shape=name, x=xkind, m=m, n=n, k=k, mode=cfg.mode, kernel=label, us=round(us, 2),
                        tbs=round(nbytes / us / 1e6, 3), pct_copy=round(100 * nbytes / us / 1e6 / COPY_TBS, 1),
                        rel_err=round(err, 5))
            except Exception as exc:  # one config failing (e.g. ptxas) must not end the sweep
                res.add(shape=name, x=xkind, m=m, kernel=label, error=repr(exc)[:300])
    del weights
    torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", choices=("modes", "tiles"), default="modes")
    args = ap.parse_args()
    res = Results("linear-gemv")
    if args.sweep == "modes":
        for name in CALLS:
            res.section(name, run_call, name, [1, 4, 16] if name != "lm_head" else [1, 16],
                        MODE_CONFIGS[:3] if args.quick or name == "lm_head" else MODE_CONFIGS)
        print("wrote", res.write(args.out))
        return 0
    configs = [GemvConfig(), GemvConfig(bn=32), GemvConfig(bn=128), GemvConfig(target_programs=528),
               GemvConfig(target_programs=132), GemvConfig(stages=6), GemvConfig(bn=32, stages=6, target_programs=528),
               GemvConfig(warps=2), GemvConfig(bn=16, target_programs=528)]
    if args.quick:
        configs = configs[:4]
    for name in SHAPES:
        res.section(name, run_shape, name, [1, 4, 16] if name != "lm_head" else [1, 16], configs)
    print("wrote", res.write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
