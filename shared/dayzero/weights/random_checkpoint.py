"""Write a random checkpoint in the exact HF gpt-oss layout (``dayzero make-checkpoint``).

Names, shapes, dtypes, sharding and MXFP4 packing are those of the released gpt-oss files
(see ``hf_reader.hf_layout``); values are random but scaled like a trained model's so that logits
are not flat and quantization errors mean something:
- embeddings ~ N(0, 1); dense weights ~ N(0, 1/fan_in); lm_head ~ N(0, (2.5)^2/H); biases ~ N(0, 0.1^2)
- RMSNorm weights ~ N(1, 0.1^2); attention sinks ~ N(0, 1); router bias ~ N(0, 0.1^2)
- experts: FP4 codes drawn from the distribution a Gaussian of std 2 (in scale units) has after
  rounding to the e2m1 grid, with e8m0 block scales 2^(e0 + jitter), jitter in {-1, 0, 1}, e0 chosen
  so the dequantized std is about 2/sqrt(H) for gate_up (so the SwiGLU clamp at 7 is sometimes
  active) and 1/sqrt(I) for down.
Every tensor has its own generator seeded from (seed, name): values do not depend on sharding.
Big presets stream tensor by tensor, chunk by chunk (never more than ~100 MB in memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib
from collections.abc import Iterator

import torch

from dayzero.config import ModelConfig, preset
from dayzero.weights.hf_reader import hf_layout
from dayzero.weights.mxfp4 import E8M0_BIAS, FP4_E2M1_VALUES
from dayzero.weights.safetensors_io import TensorSource, write_sharded

DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3
CHUNK_ELEMS = 1 << 23
CODE_SIGMA = 2.0     # std of the pre-rounding Gaussian, in units of the block scale
LUT_SIZE = 4096


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{name}".encode()))


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
        t = torch.randn((n, *shape[1:]), generator=gen) * std + mean
        yield t.to(torch.bfloat16)


def _block_chunks(gen: torch.Generator, shape: tuple[int, ...], lut: torch.Tensor) -> Iterator[torch.Tensor]:
    per_expert = math.prod(shape[1:])
    for _ in range(shape[0]):
        idx = torch.randint(0, lut.numel(), (per_expert * 2,), generator=gen, dtype=torch.int64)
        codes = lut[idx].view(per_expert, 2)                    # [..., (even=low, odd=high)]
        yield (codes[:, 0] | (codes[:, 1] << 4)).view(1, *shape[1:])


def _scale_chunks(gen: torch.Generator, shape: tuple[int, ...], base_exp: int) -> Iterator[torch.Tensor]:
    per_expert = math.prod(shape[1:])
    for _ in range(shape[0]):
        jitter = torch.randint(0, 4, (per_expert,), generator=gen)
        jitter = torch.tensor([-1, 0, 0, 1])[jitter]
        yield (E8M0_BIAS + base_exp + jitter).to(torch.uint8).view(1, *shape[1:])


def tensor_sources(cfg: ModelConfig, seed: int = 0) -> list[TensorSource]:
    """A TensorSource (lazy random values) for every tensor of the HF layout."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    lut = fp4_code_lut()
    code_std = _code_std(lut) * 1.25  # x sqrt(E[4^jitter]) = sqrt(1/16 + 1/2 + 1) = 1.25
    sources = []
    for name, shape, dtype in hf_layout(cfg):
        def produce(name=name, shape=shape):
            gen = _generator(seed, name)
            if name.endswith("_blocks"):
                return _block_chunks(gen, shape, lut)
            if name.endswith("_scales"):
                target = 2.0 / math.sqrt(H) if "gate_up" in name else 1.0 / math.sqrt(I)
                return _scale_chunks(gen, shape, round(math.log2(target / code_std)))
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                return _normal_chunks(gen, shape, 0.1, 1.0)
            if name == "model.embed_tokens.weight" or name.endswith("sinks"):
                return _normal_chunks(gen, shape, 1.0)
            if name == "lm_head.weight":
                return _normal_chunks(gen, shape, 2.5 / math.sqrt(H))
            if name.endswith("bias"):
                return _normal_chunks(gen, shape, 0.1)
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
