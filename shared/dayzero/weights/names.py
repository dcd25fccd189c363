"""Name map: canonical checkpoint names -> engine parameters.

The engine's parameters are named like the canonical tensors (HF module names, experts in (out, in)
layout), so the map is the identity for every tensor, plus one rule for FP8 block scales: the
serving checkpoint's ``<name>_scale`` belongs to parameter ``<name>`` and lands in the engine's
``<module>.weight_scale`` (linears) or ``<name>_scale`` (experts). Which tensors are FP8 in the
serving format is fixed here, once.
"""

from __future__ import annotations

import re

SCALE_SUFFIX = "_scale"

# canonical names stored as float8_e4m3fn (128x128 blocks) in the FP8 serving checkpoint
_FP8_PATTERNS = (
    re.compile(r"model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight"),
    re.compile(r"model\.layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)"),
    re.compile(r"lm_head\.weight"),
)


def is_fp8_weight(name: str) -> bool:
    """True for the canonical tensors the FP8 serving format quantizes."""
    return any(p.fullmatch(name) for p in _FP8_PATTERNS)


def scale_name(name: str) -> str:
    """Checkpoint name of the block scale of FP8 tensor ``name``."""
    return name + SCALE_SUFFIX


def is_scale_name(name: str) -> bool:
    return name.endswith(SCALE_SUFFIX) and is_fp8_weight(name[: -len(SCALE_SUFFIX)])


def param_name(canonical: str) -> str:
    """Engine parameter that loads canonical tensor ``canonical`` (identity by construction)."""
    return canonical


def engine_scale_param(canonical: str) -> str:
    """Engine parameter holding the block scale of FP8 parameter ``canonical``."""
    if canonical.endswith(".weight"):
        return canonical[: -len(".weight")] + ".weight_scale"
    return canonical + SCALE_SUFFIX
