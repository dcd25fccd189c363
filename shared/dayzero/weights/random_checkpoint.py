"""Write a random checkpoint in the exact HF gpt-oss layout (``dayzero make-checkpoint``).

Names, shapes, dtypes, sharding and MXFP4 packing are those of the released gpt-oss files
(see ``hf_reader.hf_layout``); values are random but scaled like a trained model's so that logits
are not flat and quantization errors mean something:
- embeddings ~ N(0, 1); q/k/v ~ N(0, 1/fan_in); o_proj ~ N(0, 0.5^2/fan_in); lm_head ~ N(0, 5^2/H)
  (peaked next-token distributions); biases ~ N(0, 0.1^2); RMSNorm weights ~ N(1, 0.1^2);
  attention sinks ~ N(0, 1)
- experts: FP4 codes drawn from the distribution of a Gaussian of std 2 (in scale units) rounded to
  the e2m1 grid; e8m0 block scales 2^e0 or 2^(e0+1), mixed so the dequantized std is 1/sqrt(H)
  for gate_up and 0.25/sqrt(I) for down, and 1 block in 32 an outlier (scale x4), so the SwiGLU
  clamp at 7 is active now and then.
Layer updates stay small next to the residual stream, as in a trained model: FP8 weights then keep
the logits' cosine similarity around 0.999 (a flat or chaotic random model would not).
Every tensor has its own generator seeded from (seed, name): values do not depend on sharding.
Big presets stream tensor by tensor, chunk by chunk (a few ~100 MB chunks at a time: writing the 20b
preset peaked at 0.7 GB resident).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib
from collections.abc import Iterator

import numpy as np
import torch

from dayzero.config import ModelConfig, preset
from dayzero.weights.hf_reader import hf_layout
from dayzero.weights.mxfp4 import E8M0_BIAS, FP4_E2M1_VALUES
from dayzero.weights.safetensors_io import TensorSource, write_sharded

DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3
CHUNK_ELEMS = 1 << 23
CODE_SIGMA = 2.0     # std of the pre-rounding Gaussian, in units of the block scale
LUT_SIZE = 256
OUTLIER_P, OUTLIER_SHIFT = 1 / 32, 2  # 1 block in 32 has its scale x4
# std of each weight kind in units of 1/sqrt(fan_in) (trained-model-like: layer updates are small
# next to the residual stream, logits are peaked)
GATE_UP_STD, DOWN_STD, O_PROJ_STD, LM_HEAD_STD = 1.0, 0.25, 0.5, 5.0


def _tensor_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}/{name}".encode())


def fp4_code_lut(sigma: float = CODE_SIGMA, size: int = LUT_SIZE) -> torch.Tensor:
    """uint8 [size] of e2m1 codes; a uniform index into it draws a code with the probability of
    N(0, sigma^2) rounded to the nearest FP4 value (|x| > 6 saturates), sign uniform."""
    mags = FP4_E2M1_VALUES[:8]
    edges = [(a + b) / 2 for a, b in zip(mags, mags[1:])] + [math.inf]
    cdf = [math.erf(e / (sigma * math.sqrt(2))) for e in edges]  # P(|x| < e)
    probs = [cdf[0]] + [cdf[i] - cdf[i - 1] for i in range(1, 8)]
    half = size // 2
    counts = [round(p * half) for p in probs]
    counts[0] += half - sum(counts)
    codes = [c for c, n in enumerate(counts) for _ in range(n)]
    return torch.tensor(codes + [c | 8 for c in codes], dtype=torch.uint8)


def _code_std(lut: torch.Tensor) -> float:
    vals = torch.tensor(FP4_E2M1_VALUES)[lut.long()]
    return float(vals.pow(2).mean().sqrt())


def _normal_chunks(gen: torch.Generator, shape: tuple[int, ...], std: float, mean: float = 0.0
                   ) -> Iterator[torch.Tensor]:
    row = math.prod(shape[1:])
    rows = max(1, CHUNK_ELEMS // max(1, row))
    for r0 in range(0, shape[0], rows):
        n = min(rows, shape[0] - r0)
        t = torch.randn((n, *shape[1:]), generator=gen)
        yield t.mul_(std).add_(mean).to(torch.bfloat16)


def _byte_table(lut: torch.Tensor) -> np.ndarray:
    """uint8 [65536]: a uniform 16-bit index -> one MXFP4 byte of two independent codes from ``lut``
    (low byte of the index -> low nibble = even element, high byte -> high nibble = odd element)."""
    assert lut.numel() == 256
    idx = torch.arange(65536)
    return (lut[idx & 0xFF] | (lut[idx >> 8] << 4)).numpy()


def _block_chunks(seed: int, shape: tuple[int, ...], table: np.ndarray) -> Iterator[torch.Tensor]:
    rng = np.random.default_rng(seed)  # numpy: ~5x faster than torch for this on CPU
    per_expert = math.prod(shape[1:])
    for _ in range(shape[0]):
        idx = rng.integers(0, 65536, size=per_expert, dtype=np.uint16)
        yield torch.from_numpy(table[idx]).view(1, *shape[1:])


def _scale_chunks(seed: int, shape: tuple[int, ...], target_std: float, code_std: float
                  ) -> Iterator[torch.Tensor]:
    """e8m0 exponents: e0 or e0 + 1 mixed so that the dequantized variance is target_std^2, plus
    rare outlier blocks (x4) as trained weights have."""
    ratio = (target_std / code_std) ** 2 / (1 - OUTLIER_P + OUTLIER_P * 4**OUTLIER_SHIFT)
    e0 = math.floor(math.log2(ratio) / 2)
    p_up = (ratio / 4**e0 - 1) / 3
    rng = np.random.default_rng(seed)
    per_expert = math.prod(shape[1:])
    for _ in range(shape[0]):
        exp = np.full(per_expert, E8M0_BIAS + e0, dtype=np.uint8)
        exp += rng.random(per_expert, dtype=np.float32) < p_up
        exp += (rng.random(per_expert, dtype=np.float32) < OUTLIER_P).astype(np.uint8) * OUTLIER_SHIFT
        yield torch.from_numpy(exp).view(1, *shape[1:])


def tensor_sources(cfg: ModelConfig, seed: int = 0) -> list[TensorSource]:
    """A TensorSource (lazy random values) for every tensor of the HF layout."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    lut = fp4_code_lut()
    code_std = _code_std(lut)
    table = _byte_table(lut)
    sources = []
    for name, shape, dtype in hf_layout(cfg):
        def produce(name=name, shape=shape):
            if name.endswith("_blocks"):
                return _block_chunks(_tensor_seed(seed, name), shape, table)
            gen = torch.Generator().manual_seed(_tensor_seed(seed, name))
            if name.endswith("_scales"):
                target = GATE_UP_STD / math.sqrt(H) if "gate_up" in name else DOWN_STD / math.sqrt(I)
                return _scale_chunks(_tensor_seed(seed, name), shape, target, code_std)
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                return _normal_chunks(gen, shape, 0.1, 1.0)
            if name == "model.embed_tokens.weight" or name.endswith("sinks"):
                return _normal_chunks(gen, shape, 1.0)
            if name == "lm_head.weight":
                return _normal_chunks(gen, shape, LM_HEAD_STD / math.sqrt(H))
            if name.endswith("bias"):
                return _normal_chunks(gen, shape, 0.1)
            if name.endswith("o_proj.weight"):
                return _normal_chunks(gen, shape, O_PROJ_STD / math.sqrt(shape[-1]))
            return _normal_chunks(gen, shape, 1.0 / math.sqrt(shape[-1]))  # dense [out, in]
        sources.append(TensorSource(name, tuple(shape), dtype, produce))
    return sources


def write_random_checkpoint(cfg: ModelConfig, out_dir: str | os.PathLike, seed: int = 0,
                            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: bool = False) -> None:
    """config.json + sharded safetensors + index, exactly as the released gpt-oss checkpoints."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    write_sharded(out_dir, tensor_sources(cfg, seed), max_shard_bytes,
                  progress=f"writing {os.path.basename(out_dir.rstrip('/')) or out_dir}" if progress else None)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny", help="model shape: tiny, tiny2, 20b, 120b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES)
    parser.add_argument("out", metavar="OUT", help="output directory")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = preset(args.preset)
    except ValueError as e:
        print(f"dayzero make-checkpoint: error: {e}", file=sys.stderr)
        return 2
    write_random_checkpoint(cfg, args.out, seed=args.seed, max_shard_bytes=args.max_shard_bytes, progress=True)
    print(f"wrote a random {args.preset} gpt-oss checkpoint to {args.out}")
    return 0
