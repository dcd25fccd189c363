"""Kernel registry: the model calls ops by name; the backend is chosen once.

Every op has a ``torch`` implementation that runs anywhere and is the oracle for the others.
A backend module registers its implementations with :func:`register`; :func:`get_ops` returns an
:class:`Ops` table for a backend name, falling back to ``torch`` for ops the backend lacks (the
fallback is listed in ``Ops.fallbacks`` so nothing is chosen silently).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

# backend name -> module(s) that register its ops on import
_BACKEND_MODULES: dict[str, tuple[str, ...]] = {
    "torch": ("dayzero.kernels.torch_ops", "dayzero.kernels.torch_attention"),
    "triton": ("dayzero.kernels.triton_attention", "dayzero.kernels.triton_linear", "dayzero.kernels.triton_moe",
               "dayzero.kernels.triton_norm_rope"),
}

OP_NAMES = (
    # full contracts (dtypes, edge cases): docstrings in torch_ops.py / torch_attention.py
    "rms_norm",          # (x [T,H], w [H], eps) -> [T,H] x.dtype
    "attention",         # see torch_attention.attention
    "store_kv",          # see torch_attention.store_kv
    "linear",            # (x [T,K], weight: LinearWeight, x_scale=None [T,ceil(K/128)], out_dtype=None) -> [T,N]
    "router_topk",       # (logits [T,E], k) -> (weights [T,k] logits.dtype, ids [T,k] int64)
    "moe_experts",       # (x [T,H], weights [T,k], ids [T,k], experts: ExpertWeights, limit) -> [T,H]
    "rope",              # (q [T,Hq,D], k [T,Hkv,D], cos [P,D/2], sin [P,D/2], positions [T]) -> (q, k)
    "rms_norm_quant",    # (x [T,H], w [H], eps) -> (x_fp8 [T,H], scale [T, ceil(H/128)]) per-token 1x128 groups
    "add_rms_norm",      # (x [T,H], r [T,H], w [H], eps) -> (s = x + r [T,H] x.dtype, rms_norm(s))
    "add_rms_norm_quant",  # (x [T,H], r [T,H], w [H], eps) -> (s = x + r, *rms_norm_quant(s))
)


@dataclass
class Registry:
    impls: dict[str, dict[str, Callable]] = field(default_factory=dict)

    def register(self, backend: str, name: str, fn: Callable) -> Callable:
        if name not in OP_NAMES:
            raise KeyError(f"unknown op {name!r}; known ops: {', '.join(OP_NAMES)}")
        self.impls.setdefault(backend, {})[name] = fn
        return fn


REGISTRY = Registry()


def register(backend: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: ``@register("triton", "attention")``."""

    def deco(fn: Callable) -> Callable:
        return REGISTRY.register(backend, name, fn)

    return deco


@dataclass(frozen=True)
class Ops:
    """A resolved op table; attribute access gives the callable."""

    backend: str
    table: dict[str, Callable]
    fallbacks: tuple[str, ...]

    def __getattr__(self, name: str) -> Callable:
        try:
            return self.table[name]
        except KeyError:
            raise AttributeError(name) from None


def available_backends() -> list[str]:
    return list(_BACKEND_MODULES)


def _load(backend: str) -> None:
    if backend not in _BACKEND_MODULES:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {', '.join(_BACKEND_MODULES)}")
    for mod in _BACKEND_MODULES[backend]:
        importlib.import_module(mod)


# backends that run only on a CUDA device
_NEEDS_CUDA = frozenset({"triton"})


class BackendUnavailable(ValueError):
    """The requested kernel backend cannot run here (e.g. triton without a CUDA GPU)."""


def get_ops(backend: str = "torch", device: str | None = None) -> Ops:
    """Resolve every op for ``backend`` (torch fills any gap, recorded in ``fallbacks``).

    ``device`` (e.g. "cpu", "cuda:0") is checked against the backend: a GPU backend on a CPU
    device, or on a machine without CUDA, is refused with a clear message.
    """
    if backend in _NEEDS_CUDA:
        import torch

        if not torch.cuda.is_available() or (device is not None and not str(device).startswith("cuda")):
            where = "this machine has no CUDA GPU" if not torch.cuda.is_available() else f"device is {device!r}"
            raise BackendUnavailable(f"kernel backend {backend!r} needs a CUDA device ({where}); "
                                     f"use --backend torch or --device cuda")
    _load("torch")
    if backend != "torch":
        _load(backend)
    base = REGISTRY.impls.get("torch", {})
    own = REGISTRY.impls.get(backend, {})
    table = {n: own.get(n, base.get(n)) for n in OP_NAMES}
    missing = [n for n, f in table.items() if f is None]
    if missing:
        raise RuntimeError(f"backend {backend!r}: no implementation of {', '.join(missing)} (not even torch)")
    fallbacks = tuple(n for n in OP_NAMES if n not in own) if backend != "torch" else ()
    return Ops(backend=backend, table=table, fallbacks=fallbacks)
