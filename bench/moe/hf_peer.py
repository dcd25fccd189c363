"""HF transformers' GptOss at its fastest settings, timed the way our engine is (used by e2e_hf.py).

Settings (issue 6): bf16, ``attn_implementation="flex_attention"`` and experts implementation
``"grouped_mm"``, set on a loaded model through ``set_attn_implementation`` /
``set_experts_implementation`` where this transformers has them (5.x), else through the config
attributes. Prefill: one batch-1 forward with ``logits_to_keep=1`` (the last token's logits, as our
bench), after a warm-up at the same length (flex attention compiles per shape). Decode: a manual
greedy loop over HF's own ``DynamicCache`` (what ``generate`` does, without its per-step extras),
after a flex prefill of the context; timed for each attention implementation that works.
Static cache + ``torch.compile`` is not tried (its compile alone exceeds the device budget).
"""

from __future__ import annotations

import inspect
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def set_impl(hf, attn: str | None = None, experts: str | None = None) -> dict:
    """Switch attention / experts implementations; returns what the model reports afterwards."""
    if attn is not None:
        if hasattr(hf, "set_attn_implementation"):
            hf.set_attn_implementation(attn)
        else:
            hf.config._attn_implementation = attn
    if experts is not None:
        if hasattr(hf, "set_experts_implementation"):
            hf.set_experts_implementation(experts)
        else:
            hf.config._experts_implementation = experts
    return {"attn": getattr(hf.config, "_attn_implementation", None),
            "experts": getattr(hf.config, "_experts_implementation", None)}


def _cache_kwarg(hf) -> str:
    """transformers 5.24 calls it ``cache`` (``past_key_values`` deprecated); older 5.x ``past_key_values``."""
    try:
        params = inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def new_cache(hf):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=hf.config)        # sliding layers keep only their window
    except TypeError:
        return DynamicCache()


@torch.no_grad()
def logits(hf, ids: torch.Tensor) -> torch.Tensor:
    """All-position logits of one prompt ``ids [N]`` -> [N, V] fp32."""
    return hf(ids[None]).logits[0].float()


@torch.no_grad()
def prefill_seconds(hf, ids: torch.Tensor, repeat: int) -> list[float]:
    """Batch-1 prefill of ``ids [N]`` (last-token logits), wall seconds per run after one warm-up."""
    x = ids[None]
    hf(x, logits_to_keep=1)
    sync(ids.device)
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        hf(x, logits_to_keep=1)
        sync(ids.device)
        out.append(time.perf_counter() - t0)
    return out


@torch.no_grad()
def decode(hf, batch: int, context: int, steps: int, attns: list[str], seed: int = 0,
           warmup: int = 3, deadline: float | None = None) -> list[dict]:
    """Greedy decode of ``batch`` sequences after a ``context``-token prefill, one row per attention
    implementation in ``attns`` (continuing the same cache); failures become rows with ``error``."""
    dev = hf.device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, hf.config.vocab_size, (batch, context), generator=g).to(dev)
    cache, kw = new_cache(hf), _cache_kwarg(hf)
    out = hf(ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)                 # [B, 1]
    pos = context
    rows = []
    for attn in attns:
        if deadline is not None and time.time() > deadline:
            rows.append(dict(batch=batch, context=pos, attn=attn, error="skipped (budget)"))
            continue
        try:
            impl = set_impl(hf, attn=attn)
            for i in range(warmup + steps):
                if i == warmup:
                    sync(dev)
                    t0 = time.perf_counter()
                    start = pos
                out = hf(nxt, use_cache=True, logits_to_keep=1, **{kw: cache})
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                pos += 1
            sync(dev)
            dt = (time.perf_counter() - t0) / steps
            rows.append(dict(batch=batch, context=start, steps=steps, ms_per_step=dt * 1e3,
                             tokens_per_s=batch / dt, tokens_per_s_per_seq=1 / dt, **impl))
        except Exception as e:  # noqa: BLE001 - one implementation failing leaves the others' rows
            rows.append(dict(batch=batch, context=pos, attn=attn, error=f"{type(e).__name__}: {str(e)[:400]}"))
    return rows


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)
    return {"cos_mean": cos.mean().item(), "cos_min": cos.min().item(),
            "top1_agree": (a.argmax(-1) == b.argmax(-1)).float().mean().item()}
