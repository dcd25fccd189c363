"""End to end on one GPU: the engine (Triton backend, FP8) vs HF transformers (bf16) on the same weights.

    PYTHONPATH=shared python bench/moe/e2e_hf.py --out DIR [--model 20b] [--tokens 2048]

Builds the engine model with random weights drawn on the GPU (``dayzero.bench.random_model``),
copies the same weights (FP8 dequantized to bf16, experts transposed to HF's (in, out) layout) into
HF ``GptOssForCausalLM`` (bf16, eager attention), runs one prompt of ``--tokens`` random ids through
both and reports, over every position: cosine similarity of the logits (mean, min), top-1
agreement; the same for the engine's torch backend (the FP8 emulation) to separate kernel error
from FP8 error; and both prefill times. Writes DIR/e2e-hf-<model>.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Results  # noqa: E402

from dayzero.bench import _kv, random_model  # noqa: E402
from dayzero.config import preset  # noqa: E402
from dayzero.kernels.registry import get_ops  # noqa: E402
from dayzero.runtime.model_runner import ModelRunner, SeqChunk  # noqa: E402
from dayzero.weights import fp8  # noqa: E402


def engine_logits(model, ids: list[int]) -> tuple[torch.Tensor, float]:
    kv = _kv(model, 1, len(ids))
    runner = ModelRunner(model, kv)
    kv.ensure("s", len(ids))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = runner.run([SeqChunk("s", ids, 0, "all")])[0]
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def hf_state(model) -> dict[str, torch.Tensor]:
    """Engine parameters -> HF GptOssForCausalLM state dict (bf16)."""
    params = dict(model.named_parameters())
    out = {}
    for name, p in params.items():
        if name.endswith("_scale"):
            continue
        t = p.data
        if t.dtype == torch.float8_e4m3fn:
            sname = name[: -len(".weight")] + ".weight_scale" if name.endswith(".weight") else name + "_scale"
            if t.dim() == 3:
                t = torch.stack([fp8.dequantize_weight_block(t[e], params[sname].data[e]).bfloat16()
                                 for e in range(t.shape[0])])
            else:
                t = fp8.dequantize_weight_block(t, params[sname].data).bfloat16()
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            t = t.transpose(1, 2).contiguous()                      # HF keeps experts as (in, out)
        out[name] = t.to(torch.bfloat16)
    return out


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    return {"cos_mean": cos.mean().item(), "cos_min": cos.min().item(),
            "top1_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--model", default="20b")
    ap.add_argument("--tokens", type=int, default=2048)
    args = ap.parse_args()
    res = Results(f"e2e-hf-{args.model}")
    res.section("e2e", run_e2e, args)
    print("wrote", res.write(args.out), "errors:", len(res.errors))
    return 0


def run_e2e(res: Results, args) -> None:
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = preset(args.model)
    t0 = time.perf_counter()
    model = random_model(cfg, "fp8", "triton", "cuda", seed=0, max_positions=args.tokens + 8)
    res.add(name="build_engine", seconds=time.perf_counter() - t0, fallback_ops=list(model.ops.fallbacks))
    ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    engine_logits(model, ids)                                          # warm-up (compiles)
    tri, tri_s = engine_logits(model, ids)
    triton_ops = model.ops
    model.ops = get_ops("torch")
    emu, emu_s = engine_logits(model, ids)
    model.ops = triton_ops
    res.add(name="engine_prefill_all_logits", tokens=args.tokens, triton_s=tri_s, torch_fp8_emulation_s=emu_s)
    res.add(name="triton_fp8_vs_torch_fp8_emulation", **compare(tri, emu))
    hf_cfg = GptOssConfig(**cfg.to_hf_dict())
    hf_cfg._attn_implementation = "eager"
    state = hf_state(model)
    with torch.device("cuda"):
        hf = GptOssForCausalLM._from_config(hf_cfg, dtype=torch.bfloat16)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    del state
    res.add(name="hf_load", missing=list(missing)[:8], unexpected=list(unexpected)[:8])
    hf.eval()
    x = torch.tensor([ids], device="cuda")
    with torch.no_grad():
        hf(x[:, :128])                                                  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref = hf(x).logits[0].float()
        torch.cuda.synchronize()
        hf_s = time.perf_counter() - t0
    res.add(name="hf_bf16_prefill_all_logits", tokens=args.tokens, seconds=hf_s,
            attn=hf_cfg._attn_implementation, experts=getattr(hf_cfg, "_experts_implementation", None))
    res.add(name="triton_fp8_vs_hf_bf16", tokens=args.tokens, **compare(tri, ref))
    res.add(name="torch_fp8_emulation_vs_hf_bf16", tokens=args.tokens, **compare(emu, ref))
    del hf


if __name__ == "__main__":
    sys.exit(main())
