"""``dayzero convert HF_DIR OUT_DIR``: write the FP8 serving checkpoint once, offline.

Format: the canonical names (``hf_reader``); the tensors of ``names.is_fp8_weight`` (q/k/v/o
weights, expert gate_up/down, lm_head) are float8_e4m3fn, unpadded, each with a float32
``<name>_scale`` of one scale per 128x128 block (partial edge blocks scaled over their real extent,
see ``fp8``); everything else is bf16. config.json is the source's with
``quantization_config = FP8_QUANT_CONFIG``; sharded safetensors + index like the HF files.

Conversion streams: each tensor is read (experts one expert at a time, dequantized from MXFP4),
quantized and written before the next is read, so memory stays at one expert / one row band.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Iterator

import torch

from dayzero.config import ConfigError, ModelConfig
from dayzero.weights.fp8 import BLOCK, FP8_DTYPE, quantize_weight_block
from dayzero.weights.hf_reader import HFCheckpoint, canonical_shapes, check_tensor, open_tensor_index
from dayzero.weights.names import is_fp8_weight, scale_name
from dayzero.weights.safetensors_io import CheckpointError, TensorSource, load_tensor, write_sharded

FP8_QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK],
                    "activation_scheme": "dynamic"}
DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3
ROW_BAND_ELEMS = 1 << 24  # rows per chunk of a 2-D tensor: a multiple of 128 near this many elements
SKIP_FILES = ("config.json", "model.safetensors.index.json")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def fp8_layout(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every tensor of the FP8 serving checkpoint, in model order."""
    out = []
    for name, shape in canonical_shapes(cfg).items():
        if is_fp8_weight(name):
            out.append((name, shape, FP8_DTYPE))
            out.append((scale_name(name), (*shape[:-2], _cdiv(shape[-2], BLOCK), _cdiv(shape[-1], BLOCK)),
                        torch.float32))
        else:
            out.append((name, shape, torch.bfloat16))
    return out


def _row_bands(n_rows: int, row_elems: int) -> Iterator[tuple[int, int]]:
    rows = max(BLOCK, ROW_BAND_ELEMS // max(1, row_elems) // BLOCK * BLOCK)  # keep 128-row blocks whole
    for r0 in range(0, n_rows, rows):
        yield r0, min(n_rows, r0 + rows)


def _sources(ckpt: HFCheckpoint, device: torch.device) -> list[TensorSource]:
    """Lazy sources; an FP8 weight's producer leaves its scales behind for the ``_scale`` producer
    that the writer runs right after it (same order as ``fp8_layout``)."""
    scales: dict[str, list[torch.Tensor]] = {}

    def fp8_chunks(name: str, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        scales[name] = []
        if len(shape) == 3:                      # experts: one expert at a time
            bands = ((e, e + 1) for e in range(shape[0]))
        else:                                    # [N, K]: bands of whole 128-row blocks
            bands = _row_bands(shape[0], shape[1])
        for r0, r1 in bands:
            q, s = quantize_weight_block(ckpt.read_rows(name, r0, r1, torch.float32, device))
            scales[name].append(s.cpu())
            yield q.cpu()

    def scale_chunks(name: str) -> Iterator[torch.Tensor]:
        if name not in scales:
            raise RuntimeError(f"{scale_name(name)} produced before {name}")
        yield from scales.pop(name)

    def bf16_chunks(name: str, shape: tuple[int, ...]) -> Iterator[torch.Tensor]:
        if len(shape) >= 2:
            for r0, r1 in _row_bands(shape[0], math.prod(shape[1:])):
                yield ckpt.read_rows(name, r0, r1, torch.bfloat16)
        else:
            yield ckpt.read(name, torch.bfloat16)

    out = []
    for name, shape, dtype in fp8_layout(ckpt.config):
        if dtype == FP8_DTYPE:
            out.append(TensorSource(name, shape, dtype, lambda n=name, s=shape: fp8_chunks(n, s)))
        elif dtype == torch.float32:
            base = name[: -len("_scale")]
            out.append(TensorSource(name, shape, dtype, lambda n=base: scale_chunks(n)))
        else:
            out.append(TensorSource(name, shape, dtype, lambda n=name, s=shape: bf16_chunks(n, s)))
    return out


def convert_checkpoint(hf_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: bool = True,
                       device: str | torch.device = "cpu") -> None:
    """Validate ``hf_dir``, then write the FP8 serving checkpoint; quantization runs on ``device``."""
    hf_dir, out_dir = os.fspath(hf_dir), os.fspath(out_dir)
    if os.path.abspath(hf_dir) == os.path.abspath(out_dir):
        raise CheckpointError(f"{out_dir}: output directory must differ from the input")
    ckpt = HFCheckpoint(hf_dir)  # validates everything before anything is written
    os.makedirs(out_dir, exist_ok=True)
    write_sharded(out_dir, _sources(ckpt, torch.device(device)), max_shard_bytes, progress="converting to FP8" if progress else None)
    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
        hf_config = json.load(f)
    hf_config["quantization_config"] = dict(FP8_QUANT_CONFIG)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config, f, indent=2)
    for fname in os.listdir(hf_dir):  # tokenizer, generation config, chat template ...
        src = os.path.join(hf_dir, fname)
        if os.path.isfile(src) and fname not in SKIP_FILES and not fname.endswith(".safetensors"):
            shutil.copy2(src, os.path.join(out_dir, fname))


class FP8Checkpoint:
    """A validated FP8 serving checkpoint directory; tensors read lazily."""

    def __init__(self, model_dir: str | os.PathLike):
        self.model_dir = os.fspath(model_dir)
        self.config = ModelConfig.from_json(self.model_dir)
        cfg_path = os.path.join(self.model_dir, "config.json")
        with open(cfg_path, encoding="utf-8") as f:
            q = json.load(f).get("quantization_config")
        if not isinstance(q, dict) or q.get("quant_method") != "fp8":
            raise ConfigError(f"{cfg_path}: not an FP8 serving checkpoint (quantization_config is {q!r}); "
                              f"run `dayzero convert` first")
        if list(q.get("weight_block_size", [])) != [BLOCK, BLOCK] or q.get("fmt", "e4m3") != "e4m3":
            raise ConfigError(f"{cfg_path}: unsupported FP8 format {q!r} (need e4m3 with 128x128 blocks)")
        self.tensors = open_tensor_index(self.model_dir)
        for name, shape, dtype in fp8_layout(self.config):
            ok = (dtype,) if dtype != torch.bfloat16 else (torch.bfloat16, torch.float16, torch.float32)
            check_tensor(self.tensors, self.model_dir, name, shape, ok)

    def names(self) -> list[str]:
        return [n for n, _, _ in fp8_layout(self.config)]

    def iter_tensors(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) as stored: float8 weights, fp32 ``_scale``s, bf16 rest."""
        for name in (self.names() if names is None else names):
            yield name, load_tensor(self.tensors[name])


def read_fp8_checkpoint(model_dir: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    ckpt = FP8Checkpoint(model_dir)
    return ckpt.config, dict(ckpt.iter_tensors())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hf_dir", metavar="HF_DIR", help="HF gpt-oss checkpoint (MXFP4 experts)")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="where to write the FP8 serving checkpoint")
    parser.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to dequantize/quantize (default: cuda when available); the result is identical")


def run(args: argparse.Namespace) -> int:
    try:
        convert_checkpoint(args.hf_dir, args.out_dir, max_shard_bytes=args.max_shard_bytes, device=args.device)
    except ValueError as e:  # CheckpointError / ConfigError: a clear one-line message
        print(f"dayzero convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote the FP8 serving checkpoint to {args.out_dir}")
    return 0
