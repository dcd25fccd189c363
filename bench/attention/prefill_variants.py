"""Causal prefill tile variants (configs of the shipped kernel, triton_attention_prefill.py) shared by the
sm_90 compile check (prefill_compile.py), the GPU tests (tests/kernels/test_attention_prefill_gpu.py)
and the timing script (prefill_exp.py). The first entry is the shipped default (head dim 64, full
causal: 64 x 128 tiles, 4 warps, 2 stages, 168 registers = 3 programs per SM).

A config that names BLOCK_M / BLOCK_N without ``maxnreg`` runs uncapped (the launcher drops the
default's cap); ``maxnreg=None`` lifts it explicitly. Session 4 run 1 (commit a693fc2,
``bench/results/prefill-exp-2026-11-30T192952Z.json``) also timed an exp2 split between the MUFU and an
FMA-pipe polynomial and a lazy O rescale: all slower, removed from the kernel afterwards (bench/NOTES.md).
"""

VARIANTS = {
    "default": dict(),
    "m128_n64": dict(BLOCK_M=128, BLOCK_N=64, num_stages=3),          # the default until session 4
    "m64_n128_s2": dict(BLOCK_M=64, BLOCK_N=128, num_stages=2),       # the default's tiles, uncapped
    "m128_n64_r168": dict(BLOCK_M=128, BLOCK_N=64, num_stages=3, maxnreg=168),
}
