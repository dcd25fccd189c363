"""End to end on one GPU: the engine (Triton backend, FP8) vs HF transformers (bf16) on the same weights.

    PYTHONPATH=shared python bench/moe/e2e_hf.py --out DIR [--model 20b] [--tokens 2048] [--budget-s 300]
    PYTHONPATH=shared python bench/moe/e2e_hf.py --device cpu --model tiny ...   # CPU smoke run

Builds the engine model with random weights drawn on the device (``dayzero.bench.random_model``),
copies the same weights (FP8 dequantized to bf16, experts transposed to HF's (in, out) layout) into
HF ``GptOssForCausalLM`` (bf16). Sections (``--sections``, each records its own failure):
- ``e2e``: one prompt of ``--tokens`` random ids through both (HF with eager attention): cosine
  similarity of the logits (mean, min) and top-1 agreement over every position; the same for the
  engine's torch backend (the FP8 emulation) to separate kernel error from FP8 error.
- ``hf_fast``: HF at its fastest settings (``hf_peer``: flex_attention + grouped_mm experts), its
  logits checked against HF eager on a short prompt, then prefill seconds at ``--prefill-tokens``
  (batch 1) and decode tokens/s at ``--decode-batches`` after ``--decode-context`` tokens.
- ``engine``: ours at the same points in the same run (``dayzero bench`` prefill / decode code).
``side_by_side`` rows pair them. ``--budget-s`` (and $DAYZERO_DEADLINE) skip what would not fit.
Writes DIR/e2e-hf-<model>.json (rows + errors + meta).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_peer  # noqa: E402

from dayzero.bench import _kv, bench_decode, bench_prefill, random_model  # noqa: E402
from dayzero.config import preset  # noqa: E402
from dayzero.kernels.registry import get_ops  # noqa: E402
from dayzero.runtime.model_runner import ModelRunner, SeqChunk, graphs_by_default  # noqa: E402
from dayzero.weights import fp8  # noqa: E402

compare = hf_peer.compare


def engine_logits(model, ids: list[int]) -> tuple[torch.Tensor, float]:
    kv = _kv(model, 1, len(ids))
    runner = ModelRunner(model, kv)
    kv.ensure("s", len(ids))
    hf_peer.sync(model.device)
    t0 = time.perf_counter()
    out = runner.run([SeqChunk("s", ids, 0, "all")])[0]
    hf_peer.sync(model.device)
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


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--model", default="20b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=2048, help="e2e: prompt length of the logits comparison")
    ap.add_argument("--sections", default="e2e,engine,hf_fast")
    ap.add_argument("--prefill-tokens", default="8192,32768")
    ap.add_argument("--decode-batches", default="1,64")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=600.0, help="skip HF/engine timings once this is spent")
    ap.add_argument("--breakdown", action="store_true", help="engine rows carry the per-op GPU time breakdown")
    ap.add_argument("--small-m-linear", default="default",
                    help="engine decode with the small-M linear kernel(s): default, or a comma list of gemv,w8a16")
    args = ap.parse_args()
    args.deadline = time.time() + args.budget_s
    if os.environ.get("DAYZERO_DEADLINE", "").isdigit():
        args.deadline = min(args.deadline, int(os.environ["DAYZERO_DEADLINE"]) - 10)
    from common import Results

    name = f"e2e-hf-{args.model}"
    if args.device.startswith("cuda"):
        res = Results(name)
    else:  # no GPU to describe (CPU smoke run)
        res = Results(name, meta={"commit": os.environ.get("DAYZERO_COMMIT", "unknown"), "gpu": None,
                                  "device": args.device, "torch": torch.__version__, "date_utc":
                                  datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    import transformers

    res.meta["transformers"] = transformers.__version__
    state: dict = {}
    res.section("build", build, state, args)
    sections = set(args.sections.split(","))
    for title, fn in (("e2e", run_e2e), ("engine", run_engine), ("hf_fast", run_hf_fast)):  # cheap first
        if title in sections and "hf" in state:
            res.section(title, fn, state, args)
            res.write(args.out)                                        # a cut-off run keeps what finished
    pair(res)
    print("wrote", res.write(args.out), "errors:", len(res.errors))
    return 0


def build(res, state: dict, args) -> None:
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = preset(args.model)
    cuda = args.device.startswith("cuda")
    need = max([args.tokens] + _ints(args.prefill_tokens) + [args.decode_context + max(args.decode_steps, 32) + 8]) + 8
    t0 = time.perf_counter()
    model = random_model(cfg, "fp8", "triton" if cuda else "torch", args.device, seed=0, max_positions=need)
    res.add(name="build_engine", seconds=time.perf_counter() - t0, fallback_ops=list(model.ops.fallbacks))
    state["model"], state["cfg"] = model, cfg
    hf_cfg = GptOssConfig(**cfg.to_hf_dict())
    hf_cfg._attn_implementation = "eager"
    t0 = time.perf_counter()
    weights = hf_state(model)
    with torch.device(args.device):
        hf = GptOssForCausalLM._from_config(hf_cfg, dtype=torch.bfloat16)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    del weights
    hf.eval()
    state["hf"] = hf
    res.add(name="hf_load", seconds=time.perf_counter() - t0, missing=list(missing)[:8], unexpected=list(unexpected)[:8])


def _add(res, args, **row) -> None:
    """A row, written out at once: a run cut off by its caller's timeout keeps every finished row."""
    res.add(**row)
    res.write(args.out)


def run_e2e(res, state: dict, args) -> None:
    model, cfg, hf = state["model"], state["cfg"], state["hf"]
    ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    engine_logits(model, ids)                                          # warm-up (compiles)
    tri, tri_s = engine_logits(model, ids)
    own_ops = model.ops
    model.ops = get_ops("torch")
    try:
        emu, emu_s = engine_logits(model, ids)
    finally:
        model.ops = own_ops
    be = own_ops.backend                                               # "triton" on the GPU
    res.add(name="engine_prefill_all_logits", tokens=args.tokens, **{f"{be}_s": tri_s}, torch_fp8_emulation_s=emu_s)
    res.add(name=f"{be}_fp8_vs_torch_fp8_emulation", **compare(tri, emu))
    impl = hf_peer.set_impl(hf, attn="eager")
    x = torch.tensor(ids, device=args.device)
    hf_peer.logits(hf, x[:128])                                        # warm-up
    hf_peer.sync(args.device)
    t0 = time.perf_counter()
    ref = hf_peer.logits(hf, x)
    hf_peer.sync(args.device)
    res.add(name="hf_bf16_prefill_all_logits", tokens=args.tokens, seconds=time.perf_counter() - t0, **impl)
    res.add(name=f"{be}_fp8_vs_hf_bf16", tokens=args.tokens, **compare(tri, ref))
    res.add(name="torch_fp8_emulation_vs_hf_bf16", tokens=args.tokens, **compare(emu, ref))


def run_hf_fast(res, state: dict, args) -> None:
    """HF at flex_attention + grouped_mm; falls back to eager attention (and says so) where flex fails."""
    hf, cfg = state["hf"], state["cfg"]
    x = torch.randint(0, cfg.vocab_size, (512,), generator=torch.Generator().manual_seed(2)).to(args.device)
    hf_peer.set_impl(hf, attn="eager", experts="grouped_mm")
    ref = hf_peer.logits(hf, x)
    attn = "flex_attention"
    try:
        impl = hf_peer.set_impl(hf, attn=attn)
        _add(res, args, name="hf_fast_vs_hf_eager", tokens=len(x), **impl, **compare(hf_peer.logits(hf, x), ref))
    except Exception as e:  # noqa: BLE001 - e.g. flex with sinks refuses the CPU
        _add(res, args, name="hf_fast_unavailable", attn=attn, error=f"{type(e).__name__}: {str(e)[:400]}")
        attn = "eager"
        impl = hf_peer.set_impl(hf, attn=attn)
    for n in _ints(args.prefill_tokens):
        if time.time() > args.deadline or (attn == "eager" and n > 8192 and args.device.startswith("cuda")):
            _add(res, args, name="hf_fast_prefill", tokens=n, skipped="budget" if time.time() > args.deadline
                    else "eager attention materialises N^2 scores")
            continue
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).to(args.device)
        times = hf_peer.prefill_seconds(hf, ids, repeat=3 if n <= 8192 else 2)
        _add(res, args, name="hf_fast_prefill", tokens=n, seconds=sorted(times)[len(times) // 2], all_seconds=times, **impl)
    attns = [attn] + (["eager"] if attn != "eager" else [])
    for b in _ints(args.decode_batches):
        if time.time() > args.deadline:
            _add(res, args, name="hf_fast_decode", batch=b, skipped="budget")
            continue
        hf_peer.set_impl(hf, attn=attn)
        for row in hf_peer.decode(hf, b, args.decode_context, args.decode_steps, attns, deadline=args.deadline):
            _add(res, args, name="hf_fast_decode", **row)
    hf_peer.set_impl(hf, attn=attn)


def run_engine(res, state: dict, args) -> None:
    """Ours at the HF points: ``dayzero bench`` prefill (median of 3) and decode (graphs where default),
    decode once per ``--small-m-linear`` kernel (``triton_linear.ONE_LAUNCH_SPLIT_K``)."""
    model = state["model"]
    for n in _ints(args.prefill_tokens):
        if time.time() > args.deadline:
            _add(res, args, name="engine_prefill", tokens=n, skipped="budget")
            continue
        r = bench_prefill(model, n, repeat=3, breakdown=args.breakdown and n == min(_ints(args.prefill_tokens)),
                          usd=3.0, seed=n)
        _add(res, args, name="engine_prefill", backend=model.ops.backend, **r)
    graphs = graphs_by_default(model)
    kernels = [None] if args.small_m_linear == "default" else args.small_m_linear.split(",")
    tlin = None
    if kernels != [None]:  # triton is imported only when asked for (the CPU smoke run has none)
        import dayzero.kernels.triton_linear as tlin
    default = tlin.ONE_LAUNCH_SPLIT_K if tlin else None
    try:
        for kernel in kernels:
            if kernel is not None:
                tlin.ONE_LAUNCH_SPLIT_K = kernel == "gemv"
            label = "default" if tlin is None else ("gemv" if tlin.ONE_LAUNCH_SPLIT_K else "w8a16")
            for b in _ints(args.decode_batches):
                if time.time() > args.deadline:
                    _add(res, args, name="engine_decode", batch=b, small_m_linear=label, skipped="budget")
                    continue
                steps = max(args.decode_steps, 32) if model.device.type == "cuda" else args.decode_steps
                try:
                    r = bench_decode(model, b, args.decode_context, steps, seed=0, graphs=graphs,
                                     breakdown=args.breakdown and b == 1)
                except Exception as exc:  # one kernel failing must not drop the other's rows
                    _add(res, args, name="engine_decode", batch=b, small_m_linear=label, error=repr(exc)[:400])
                    continue
                _add(res, args, name="engine_decode", backend=model.ops.backend, small_m_linear=label, **r)
    finally:
        if tlin is not None:
            tlin.ONE_LAUNCH_SPLIT_K = default


def pair(res) -> None:
    """side_by_side rows: ours and HF's fastest at each prefill length / decode batch of this run."""
    rows = res.rows
    for r in [r for r in rows if r.get("name") == "engine_prefill" and "seconds" in r]:
        hf = [h for h in rows if h.get("name") == "hf_fast_prefill" and h.get("tokens") == r["tokens"] and "seconds" in h]
        if hf:
            res.add(name="side_by_side", mode="prefill", tokens=r["tokens"], engine_s=r["seconds"],
                    hf_s=hf[0]["seconds"], hf_attn=hf[0].get("attn"), speedup=hf[0]["seconds"] / r["seconds"])
    for r in [r for r in rows if r.get("name") == "engine_decode" and "tokens_per_s" in r]:
        hf = [h for h in rows if h.get("name") == "hf_fast_decode" and h.get("batch") == r["batch"] and "tokens_per_s" in h]
        if hf:
            best = max(hf, key=lambda h: h["tokens_per_s"])
            res.add(name="side_by_side", mode="decode", batch=r["batch"], engine_tok_s=r["tokens_per_s"],
                    hf_tok_s=best["tokens_per_s"], hf_attn=best.get("attn"),
                    speedup=r["tokens_per_s"] / best["tokens_per_s"])


if __name__ == "__main__":
    sys.exit(main())
