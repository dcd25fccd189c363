"""Load a checkpoint directory into the engine model: a name map plus per-parameter loaders.

Two source formats, told apart by ``config.json``'s ``quantization_config.quant_method``:
  * ``mxfp4`` (or none): an HF gpt-oss checkpoint, streamed one tensor at a time by
    ``dayzero.weights.hf_reader`` (experts dequantized from MXFP4);
  * ``fp8``: the serving checkpoint of ``dayzero convert`` (FP8 tensors + ``<name>_scale``).
Any target dtype works from either: ``fp8`` from an HF dir quantizes at load; ``float32`` or
``bfloat16`` from an FP8 dir dequantizes. Every engine parameter must be loaded exactly once and
every checkpoint tensor must be used; otherwise ``WeightLoadError`` names the tensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import torch

from dayzero.config import ConfigError, ModelConfig
from dayzero.model.layers import ParallelConfig, WeightLoadError
from dayzero.model.transformer import GptOssForEngine

from .names import engine_scale_param, is_fp8_weight, is_scale_name, param_name, scale_name


def checkpoint_format(model_dir: str | os.PathLike) -> str:
    """``"fp8"`` for a serving checkpoint, ``"hf"`` otherwise."""
    path = os.path.join(os.fspath(model_dir), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            q = json.load(f).get("quantization_config") or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: config.json not found") from None
    except (json.JSONDecodeError, AttributeError) as e:
        raise ConfigError(f"{path}: not a valid config.json ({e})") from None
    return "fp8" if isinstance(q, dict) and q.get("quant_method") == "fp8" else "hf"


def load_weights(model: GptOssForEngine, tensors: Iterable[tuple[str, torch.Tensor]], source: str = "checkpoint") -> None:
    """Feed (canonical name, tensor) pairs to the parameters' loaders; FP8 tensors are paired with
    their ``<name>_scale`` whichever comes first. Checks completeness at the end."""
    params = dict(model.named_parameters())
    scale_params = {engine_scale_param(n) for n in params if is_fp8_weight(n)}
    todo = {n for n in params if n not in scale_params}
    waiting: dict[str, torch.Tensor] = {}   # fp8 weights waiting for their scale, or scales for their weight
    unexpected: list[str] = []

    def load(name: str, t: torch.Tensor, scale: torch.Tensor | None) -> None:
        pname = param_name(name)
        if pname not in todo:
            (unexpected.append(name) if pname not in params else
             _raise(f"{source}: tensor {name} appears twice"))
            return
        try:
            params[pname].weight_loader(t, scale)
        except WeightLoadError as e:
            raise WeightLoadError(f"{source}: {e}") from None
        todo.discard(pname)

    for name, t in tensors:
        if is_scale_name(name):
            base = name[: -len("_scale")]
            if base in waiting:
                load(base, waiting.pop(base), t)
            else:
                waiting[name] = t
        elif t.dtype == torch.float8_e4m3fn:
            sname = scale_name(name)
            if sname in waiting:
                load(name, t, waiting.pop(sname))
            else:
                waiting[name] = t
        else:
            load(name, t, None)
    for name in list(waiting):
        if is_scale_name(name):
            unexpected.append(name + " (its float8 tensor is missing)")
        else:
            raise WeightLoadError(f"{source}: tensor {name} is float8 but {scale_name(name)} is missing")
    if unexpected:
        raise WeightLoadError(f"{source}: unexpected tensor(s) not used by the model: {', '.join(sorted(unexpected)[:8])}")
    if todo:
        missing = sorted(todo)
        raise WeightLoadError(f"{source}: missing tensor(s): {', '.join(missing[:8])}"
                              + (f" (+{len(missing) - 8} more)" if len(missing) > 8 else ""))


def _raise(msg: str) -> None:
    raise WeightLoadError(msg)


def load_model(model_dir: str | os.PathLike, dtype: str = "bfloat16", backend: str = "torch",
               device: torch.device | str = "cpu", parallel: ParallelConfig | None = None,
               max_positions: int | None = None) -> GptOssForEngine:
    """Build the engine model for ``model_dir`` (HF or FP8 format) and load its weights."""
    model_dir = os.fspath(model_dir)
    fmt = checkpoint_format(model_dir)
    if fmt == "fp8":
        from .convert import FP8Checkpoint

        fp8_ckpt = FP8Checkpoint(model_dir)      # validated; tensors streamed one at a time
        cfg = fp8_ckpt.config
        tensors: Iterable[tuple[str, torch.Tensor]] = fp8_ckpt.iter_tensors()
    else:
        from .hf_reader import HFCheckpoint

        ckpt = HFCheckpoint(model_dir)
        cfg = ckpt.config
        read_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        tensors = ckpt.iter_tensors(read_dtype)
    model = GptOssForEngine(cfg, dtype=dtype, backend=backend, device=device, parallel=parallel,
                            max_positions=max_positions)
    load_weights(model, tensors, source=model_dir)
    return model


def model_config(model_dir: str | os.PathLike) -> ModelConfig:
    return ModelConfig.from_json(model_dir)
