"""Decode attention version 3 (triton_attention_wslice: one slice of keys per warp) vs the torch reference.

Ragged cached lengths around page / slice / tile edges, a sequence without a new token, split counts from
one to more than the tiles, GQA groups 8 / 4 / 1, head dims 16-128, page sizes 8-64 (a slice spanning two
pages, several slices in one page), slices of 16 / 32 keys and 2 / 4 / 8 warps. Output poisoned with NaN;
bf16 relative error per sequence < 1e-2 against the fp32 reference. The engine-level decode tests (graph
replay, PDL twins, determinism) run the kernel through test_attention_gpu.py's variants.
On the CPU: ``TRITON_INTERPRET=1 DAYZERO_KERNEL_TEST_DEVICE=cpu pytest --noconftest ...`` (fp16 inputs,
as bf16 dots are broken in the interpreter; small shapes).
"""

from __future__ import annotations

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
BASE = dict(MERGE="kernel", STRIDED=True, WSLICE=True, BLOCK_N=64)
TILES = {"w4": {}, "w4_sub32": dict(SUB=32), "w2": dict(num_warps=2), "w8": dict(num_warps=8)}
SHAPES = [(16, 2, 32, 16), (8, 2, 16, 8), (4, 1, 64, 64), (8, 8, 128, 32)]


@pytest.mark.parametrize("tiles", list(TILES))
@pytest.mark.parametrize("hq,hkv,d,bs", SHAPES)
def test_wslice_decode(tiles, hq, hkv, d, bs):
    from dayzero.kernels.triton_attention import attention

    cached = [0, 1, 15, 16, 17, 129, 300, 1000]
    q_lens = [1] * len(cached)
    q_lens[3] = 0   # a sequence with no new token this step
    case = make_case(q_lens, cached, hq=hq, hkv=hkv, d=d, bs=bs, sinks="mixed", dtype=DTYPE, device=DEV,
                     seed=hq * d + bs)
    ref = ref_ops.attention(*case.args())
    for ns in (1, 3, 16, 70):
        out = torch.full_like(case.q, float("nan"))
        res = attention(*case.args(), out=out, max_seqlen_q=1, num_splits=ns, config=dict(BASE, **TILES[tiles]))
        check_output(res, out, ref, case.cu_seqlens_q, TOL)
