"""Causal prefill tile variants (``bench/attention/prefill_variants.py``: the shipped 64 x 128 default with
its 168-register cap, the old 128 x 64 default, uncapped / capped alternatives) vs the torch reference op.

Every variant the timing script measures is checked here, so one that wins can become the default
with its tests passed in the same device call. Fresh random inputs per case, output poisoned with NaN
(an unwritten element fails), bf16 relative error per sequence < 1e-2 against the fp32 reference.
Beside the ragged/paged cases: scores spread over hundreds of log2 units (most probabilities underflow)
and row maxima that keep growing along the keys (the running max and O rescale at every tile).
On the CPU: ``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu pytest --noconftest ...`` (fp16 inputs,
as bf16 dots are broken in the interpreter; two variants, small shapes).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest
import torch

from gpu_util import DEV

pytest.importorskip("triton", reason="the Triton kernels need triton (GPU machines)")  # CI: skip at collection
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(DEV == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from dayzero.kernels import torch_attention as ref_ops  # noqa: E402
from dayzero.kernels.triton_attention_cases import check_output, make_case  # noqa: E402

TOL = 1e-2
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float16
_spec = importlib.util.spec_from_file_location(
    "prefill_variants", pathlib.Path(__file__).resolve().parents[2] / "bench" / "attention" / "prefill_variants.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
# DAYZERO_PREFILL_VARIANTS=a,b: only these (a device call that times only them)
_ONLY = [n for n in os.environ.get("DAYZERO_PREFILL_VARIANTS", "").split(",") if n]
VARIANTS = {k: v for k, v in _mod.VARIANTS.items()
            if (k in _ONLY if _ONLY else DEV == "cuda" or k in ("default", "m128_n64"))}


def _case(q_lens, cached, **kw):
    return make_case(q_lens, cached, dtype=DTYPE, device=DEV, **kw)


def _check(case, cfg: dict) -> list[float]:
    from dayzero.kernels.triton_attention import attention

    ref = ref_ops.attention(*case.args())
    out = torch.full_like(case.q, float("nan"))
    res = attention(*case.args(), out=out, config=dict(KERNEL="flash", **cfg))
    if DEV == "cuda":
        torch.cuda.synchronize()
    return check_output(res, out, ref, case.cu_seqlens_q, TOL)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("window", [0, 128])
def test_ragged_paged(variant, window):
    """Ragged new tokens after ragged paged prefixes (every tile phase: window edge, full, diagonal)."""
    big = DEV == "cuda"
    q_lens = [1, 200, 64, 1100, 17] if big else [1, 150, 300]
    cached = [0, 300, 127, 0, 1000] if big else [0, 70, 0]
    _check(_case(q_lens, cached, window=window, sinks="mixed", seed=31 + window), VARIANTS[variant])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_long_and_extreme_scores(variant):
    cfg = VARIANTS[variant]
    n = 2048 if DEV == "cuda" else 384
    _check(_case([n], [0], sinks="normal", seed=5), cfg)
    # scores spread over hundreds of log2 units: most probabilities underflow to 0
    case = _case([n, 3], [0, 40], sinks="mixed", seed=6)
    case.q.mul_(40.0)
    _check(case, cfg)
    # keys that grow along the sequence: each row's max keeps rising, O is rescaled tile after tile
    case = _case([n], [0], sinks="large", seed=7)
    ramp = torch.linspace(0.2, 4.0, n, device=DEV, dtype=torch.float32)[:, None, None]
    case.k.copy_((case.k.float() * ramp).to(case.k.dtype))
    _check(case, cfg)
