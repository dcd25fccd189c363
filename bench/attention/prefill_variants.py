"""Causal prefill variants (configs of the shipped kernel, triton_attention_prefill.py) shared by the
sm_90 compile check, the GPU tests and the timing script. The first entry is the shipped default.

EXP_POLY n: every n-th unmasked key tile's exp2 as an FMA-pipe polynomial (degree POLY_DEG, default 3);
EXP_COLS 2: half of every tile's columns; LAZY t: O / l rescaled only when a row max grows by > t (log2
units); maxnreg r: registers capped so that 65536 / (32 * num_warps * r) programs fit per SM (168: 3 at
4 warps, 128: 4), num_stages: K/V buffers in shared memory (also bounds programs per SM).
"""

VARIANTS = {
    "default": dict(),
    "lazy8": dict(LAZY=8.0),
    "poly8": dict(EXP_POLY=8),
    "poly4": dict(EXP_POLY=4),
    "cols2_d2": dict(EXP_COLS=2, POLY_DEG=2),
    "lazy8_poly8": dict(LAZY=8.0, EXP_POLY=8),
    "r168": dict(maxnreg=168),
    "r168_lazy8": dict(maxnreg=168, LAZY=8.0),
    "r168_poly8": dict(maxnreg=168, EXP_POLY=8),
    "m64_r128_s2": dict(BLOCK_M=64, maxnreg=128, num_stages=2),
}
