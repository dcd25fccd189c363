"""Shared fixtures: tiny random HF checkpoints (written once per session) and the ``gpu`` skip."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import pytest
import torch

from dayzero.config import ModelConfig, preset as get_preset


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory) -> Callable[..., str]:
    """``make_ckpt(preset, seed=0, max_shard_bytes=None) -> dir`` of a random HF gpt-oss checkpoint.

    ``preset`` is a preset name (``tiny``, ``tiny2``) or a ``ModelConfig``. Checkpoints are written
    once per session and shared: treat the directory as read-only (copy it to corrupt it).
    """
    from dayzero.weights.random_checkpoint import DEFAULT_MAX_SHARD_BYTES, write_random_checkpoint

    cache: dict[tuple, str] = {}

    def make(preset: str | ModelConfig, seed: int = 0, max_shard_bytes: int | None = None) -> str:
        cfg = get_preset(preset) if isinstance(preset, str) else preset
        key = (repr(dataclasses.astuple(cfg)), seed, max_shard_bytes)
        if key not in cache:
            label = preset if isinstance(preset, str) else "cfg"
            out = tmp_path_factory.mktemp(f"ckpt-{label}-s{seed}")
            write_random_checkpoint(cfg, out, seed=seed, max_shard_bytes=max_shard_bytes or DEFAULT_MAX_SHARD_BYTES)
            cache[key] = os.fspath(out)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def hf_model() -> Callable[[str], "torch.nn.Module"]:
    """``hf_model(ckpt_dir)`` -> HF transformers' ``GptOssForCausalLM`` loaded from that directory:
    fp32, eager attention, MXFP4 experts dequantized by transformers itself (CPU). Cached per dir."""
    cache: dict[str, torch.nn.Module] = {}

    def load(ckpt_dir: str) -> torch.nn.Module:
        if ckpt_dir not in cache:
            from transformers import GptOssForCausalLM, Mxfp4Config
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            model = GptOssForCausalLM.from_pretrained(
                ckpt_dir, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32,
                attn_implementation="eager")
            cache[ckpt_dir] = model.eval()
        return cache[ckpt_dir]

    return load
