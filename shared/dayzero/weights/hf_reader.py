"""Read an HF gpt-oss checkpoint directory into the canonical in-memory names.

Layout handled: ``config.json`` + ``model.safetensors.index.json`` + shards (or one
``model.safetensors``). Experts come as MXFP4 ``*_blocks``/``*_scales`` (the released files) and
are dequantized to the (out, in) layout: ``gate_up_proj`` [E, 2I, H] (gate even rows, up odd rows)
and ``down_proj`` [E, H, I]. A non-quantized HF save (``gate_up_proj`` [E, H, 2I], transformers'
own layout) is accepted too and transposed to the same canonical layout.

Everything is checked before any data is used: the config, the index against the files, every
shard's header against the file size, every expected tensor present with its shape and dtype. Any
problem raises ``CheckpointError`` (or ``ConfigError`` for config.json) naming the file and tensor.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterable, Iterator

import torch

from dayzero.config import ModelConfig
from dayzero.weights.mxfp4 import dequantize_mxfp4, mxfp4_shapes
from dayzero.weights.safetensors_io import INDEX_FILE, CheckpointError, TensorInfo, load_tensor, read_header

__all__ = ["CheckpointError", "HFCheckpoint", "canonical_shapes", "hf_layout", "iter_hf_checkpoint",
           "open_tensor_index", "read_hf_checkpoint"]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
EXPERT_PROJS = ("gate_up_proj", "down_proj")


def canonical_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape (the contract of the common brief), in model order."""
    H, V, E, I = cfg.hidden_size, cfg.vocab_size, cfg.num_local_experts, cfg.intermediate_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        for proj, n in (("q", cfg.q_size), ("k", cfg.kv_size), ("v", cfg.kv_size)):
            out[p + f"self_attn.{proj}_proj.weight"] = (n, H)
            out[p + f"self_attn.{proj}_proj.bias"] = (n,)
        out[p + "self_attn.o_proj.weight"] = (H, cfg.q_size)
        out[p + "self_attn.o_proj.bias"] = (H,)
        out[p + "self_attn.sinks"] = (cfg.num_attention_heads,)
        out[p + "mlp.router.weight"] = (E, H)
        out[p + "mlp.router.bias"] = (E,)
        out[p + "mlp.experts.gate_up_proj"] = (E, 2 * I, H)
        out[p + "mlp.experts.gate_up_proj_bias"] = (E, 2 * I)
        out[p + "mlp.experts.down_proj"] = (E, H, I)
        out[p + "mlp.experts.down_proj_bias"] = (E, H)
    out["model.norm.weight"] = (H,)
    out["lm_head.weight"] = (V, H)
    return out


def hf_layout(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every tensor in a released (MXFP4) gpt-oss checkpoint, in model order."""
    out = []
    for name, shape in canonical_shapes(cfg).items():
        if name.endswith(EXPERT_PROJS):
            E, rows, cols = shape
            blocks, scales = mxfp4_shapes(rows, cols)
            out.append((name + "_blocks", (E, *blocks), torch.uint8))
            out.append((name + "_scales", (E, *scales), torch.uint8))
        else:
            out.append((name, shape, torch.bfloat16))
    return out


def _is_mxfp4(model_dir: str) -> bool:
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        q = json.load(f).get("quantization_config") or {}
    return isinstance(q, dict) and q.get("quant_method") == "mxfp4"


def _shard_files(model_dir: str) -> tuple[dict[str, str] | None, list[str]]:
    """(index weight_map or None, shard paths)."""
    index_path = os.path.join(model_dir, INDEX_FILE)
    if os.path.exists(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index_path}: malformed index ({e})") from None
        by_file: dict[str, list[str]] = {}
        for name, fname in weight_map.items():
            by_file.setdefault(str(fname), []).append(name)
        for fname, names in sorted(by_file.items()):
            path = os.path.join(model_dir, fname)
            if not os.path.isfile(path):
                shown = ", ".join(sorted(names)[:3]) + (" ..." if len(names) > 3 else "")
                raise CheckpointError(f"{path}: shard listed in {INDEX_FILE} is missing "
                                      f"(it holds {len(names)} tensor(s): {shown})")
        return weight_map, [os.path.join(model_dir, f) for f in sorted(by_file)]
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise CheckpointError(f"{model_dir}: no {INDEX_FILE} and no *.safetensors files")
    return None, files


def open_tensor_index(model_dir: str) -> dict[str, TensorInfo]:
    """name -> TensorInfo over all shards, with the index checked against every file's header."""
    weight_map, files = _shard_files(model_dir)
    tensors: dict[str, TensorInfo] = {}
    for path in files:
        for name, info in read_header(path).items():
            if name in tensors:
                raise CheckpointError(f"{path}: tensor {name} is also stored in {tensors[name].file}")
            tensors[name] = info
    if weight_map is not None:
        for name, fname in weight_map.items():
            info = tensors.get(name)
            if info is None or os.path.basename(info.file) != fname:
                raise CheckpointError(f"{os.path.join(model_dir, fname)}: tensor {name} is listed in "
                                      f"{INDEX_FILE} but not stored in that file")
    return tensors


def check_tensor(tensors: dict[str, TensorInfo], model_dir: str, name: str, shape: tuple[int, ...],
                 dtypes: tuple[torch.dtype, ...]) -> None:
    """CheckpointError unless ``name`` is stored with ``shape`` and one of ``dtypes``."""
    info = tensors.get(name)
    if info is None:
        raise CheckpointError(f"{model_dir}: tensor {name} is missing from the checkpoint")
    if info.shape != tuple(shape):
        raise CheckpointError(f"{info.file}: tensor {name} has shape {list(info.shape)}, expected "
                              f"{list(shape)} for this config.json")
    if info.dtype not in dtypes:
        raise CheckpointError(f"{info.file}: tensor {name} has dtype {info.dtype}, expected one of "
                              f"{', '.join(str(d) for d in dtypes)}")


class HFCheckpoint:
    """A validated HF gpt-oss checkpoint directory; tensors are read lazily, one at a time."""

    def __init__(self, model_dir: str | os.PathLike):
        self.model_dir = os.fspath(model_dir)
        self.config = ModelConfig.from_json(self.model_dir)
        self.mxfp4 = _is_mxfp4(self.model_dir)
        self.tensors = open_tensor_index(self.model_dir)
        self._check_expected()

    def _check_expected(self) -> None:
        cfg = self.config
        for name, shape in canonical_shapes(cfg).items():
            if name.endswith(EXPERT_PROJS) and self.mxfp4:
                E, rows, cols = shape
                b, s = mxfp4_shapes(rows, cols)
                self._check(name + "_blocks", (E, *b), (torch.uint8,))
                self._check(name + "_scales", (E, *s), (torch.uint8,))
            elif name.endswith(EXPERT_PROJS):
                self._check(name, (shape[0], shape[2], shape[1]), FLOAT_DTYPES)  # HF's [E, in, out]
            else:
                self._check(name, shape, FLOAT_DTYPES)

    def _check(self, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
        check_tensor(self.tensors, self.model_dir, name, shape, dtypes)

    def names(self) -> list[str]:
        return list(canonical_shapes(self.config))

    def read(self, name: str, dtype: torch.dtype = torch.float32,
             device: torch.device | str | None = None) -> torch.Tensor:
        """One tensor by canonical name, experts dequantized to (out, in) layout (on ``device``)."""
        return self.read_rows(name, None, None, dtype, device)

    def read_rows(self, name: str, r0: int | None, r1: int | None, dtype: torch.dtype = torch.float32,
                  device: torch.device | str | None = None) -> torch.Tensor:
        """Rows r0:r1 of dim 0 (e.g. a range of experts; None: all) without reading the rest.
        MXFP4 experts are moved to ``device`` packed and dequantized there."""
        rows = None if r0 is None else (r0, r1)
        if name.endswith(EXPERT_PROJS) and self.mxfp4:
            blocks = load_tensor(self.tensors[name + "_blocks"], rows).to(device)
            scales = load_tensor(self.tensors[name + "_scales"], rows).to(device)
            return dequantize_mxfp4(blocks, scales, dtype)
        if name not in self.tensors:
            raise KeyError(f"{name} is not a tensor of this checkpoint")
        t = load_tensor(self.tensors[name], rows).to(device=device, dtype=dtype)
        if name.endswith(EXPERT_PROJS):  # transformers' own layout [E, in, out] -> [E, out, in]
            t = t.transpose(1, 2).contiguous()
        return t

    def iter_tensors(self, dtype: torch.dtype = torch.float32,
                     names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        for name in (self.names() if names is None else names):
            yield name, self.read(name, dtype)


def iter_hf_checkpoint(model_dir: str | os.PathLike, dtype: torch.dtype = torch.float32,
                       names: Iterable[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Lazy (name, tensor) pairs in model order; only one tensor is materialized at a time."""
    yield from HFCheckpoint(model_dir).iter_tensors(dtype, names)


def read_hf_checkpoint(model_dir: str | os.PathLike, dtype: torch.dtype = torch.float32,
                       names: Iterable[str] | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    ckpt = HFCheckpoint(model_dir)
    return ckpt.config, dict(ckpt.iter_tensors(dtype, names))
