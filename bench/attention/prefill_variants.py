"""Causal prefill variants (configs of the shipped kernel, triton_attention_prefill.py) shared by the
sm_90 compile check, the GPU tests and the timing script. The first entry is the shipped default.

EXP_POLY n: every n-th unmasked key tile's exp2 as an FMA-pipe polynomial (degree POLY_DEG, default 3);
EXP_COLS 2: half of every tile's columns; LAZY t: O / l rescaled only when a row max grows by > t (log2
units); maxnreg r: registers capped so that 65536 / (32 * num_warps * r) programs fit per SM (168: 3 at
4 warps, 128: 4), num_stages: K/V buffers in shared memory (also bounds programs per SM).
Run 1 (``bench/results/prefill-exp-2026-11-30T192952Z.json``) timed the first group against the then
default ``m128_n64``; run 2 the 64 x 128 tiles. Configs name every key they change from the default.
"""

_OLD = dict(BLOCK_M=128, BLOCK_N=64, num_stages=3, maxnreg=None)  # the default until session 4 (run 1's "default")

VARIANTS = {
    "default": dict(),
    "m128_n64": dict(_OLD),
    "lazy8": dict(_OLD, LAZY=8.0),
    "poly8": dict(_OLD, EXP_POLY=8),
    "poly4": dict(_OLD, EXP_POLY=4),
    "cols2_d2": dict(_OLD, EXP_COLS=2, POLY_DEG=2),
    "lazy8_poly8": dict(_OLD, LAZY=8.0, EXP_POLY=8),
    "r168": dict(_OLD, maxnreg=168),
    "r168_lazy8": dict(_OLD, maxnreg=168, LAZY=8.0),
    "r168_poly8": dict(_OLD, maxnreg=168, EXP_POLY=8),
    "m64_r128_s2": dict(_OLD, BLOCK_M=64, maxnreg=128, num_stages=2),
    # run 2: 64 query rows x 128 keys per tile (the default is m64_n128_r168_s2)
    "m64_n128_s2": dict(BLOCK_M=64, BLOCK_N=128, num_stages=2, maxnreg=None),
    "m64_n128_r168_s2_lazy8": dict(BLOCK_M=64, BLOCK_N=128, num_stages=2, maxnreg=168, LAZY=8.0),
}
