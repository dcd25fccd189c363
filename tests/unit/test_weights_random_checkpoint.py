"""The random checkpoint has the exact HF gpt-oss layout and trained-model-like scales."""

from __future__ import annotations

import json
import os
import time

import torch

from dayzero.config import ModelConfig, preset
from dayzero.weights.hf_reader import hf_layout, read_hf_checkpoint
from dayzero.weights.random_checkpoint import DOWN_STD, GATE_UP_STD, LM_HEAD_STD, write_random_checkpoint
from dayzero.weights.safetensors_io import INDEX_FILE, load_tensor, read_header


def test_layout_index_and_config(make_ckpt):
    cfg = preset("tiny2")
    d = make_ckpt("tiny2", 0, 200_000)  # small shards: several files
    with open(os.path.join(d, INDEX_FILE)) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    assert files == [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    stored = {}
    for fname in files:
        for name, info in read_header(os.path.join(d, fname)).items():
            assert index["weight_map"][name] == fname
            stored[name] = (info.shape, info.dtype)
    expected = {n: (s, dt) for n, s, dt in hf_layout(cfg)}
    assert stored == expected
    assert index["metadata"]["total_size"] == sum(
        torch.empty(s, dtype=dt).nbytes for s, dt in expected.values())
    E, I, H = cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size
    assert stored["model.layers.0.mlp.experts.gate_up_proj_blocks"] == ((E, 2 * I, H // 32, 16), torch.uint8)
    assert stored["model.layers.0.mlp.experts.down_proj_scales"] == ((E, H, I // 32), torch.uint8)
    assert stored["model.layers.0.self_attn.sinks"][1] == torch.bfloat16
    hf = json.load(open(os.path.join(d, "config.json")))
    assert hf["quantization_config"]["quant_method"] == "mxfp4"
    assert ModelConfig.from_json(d) == cfg


def test_deterministic_and_seeded(tmp_path):
    cfg = preset("tiny2")
    write_random_checkpoint(cfg, tmp_path / "a", seed=3)
    write_random_checkpoint(cfg, tmp_path / "b", seed=3, max_shard_bytes=100_000)
    write_random_checkpoint(cfg, tmp_path / "c", seed=4)
    _, a = read_hf_checkpoint(tmp_path / "a")
    _, b = read_hf_checkpoint(tmp_path / "b")
    _, c = read_hf_checkpoint(tmp_path / "c")
    assert all(torch.equal(a[k], b[k]) for k in a)  # sharding does not change values
    assert not torch.equal(a["lm_head.weight"], c["lm_head.weight"])


def test_trained_like_scales(make_ckpt):
    cfg, sd = read_hf_checkpoint(make_ckpt("tiny2"))
    H, I = cfg.hidden_size, cfg.intermediate_size
    gu = sd["model.layers.0.mlp.experts.gate_up_proj"]
    dn = sd["model.layers.0.mlp.experts.down_proj"]
    assert abs(gu.std() * H**0.5 / GATE_UP_STD - 1) < 0.15, gu.std()
    assert abs(dn.std() * I**0.5 / DOWN_STD - 1) < 0.15, dn.std()
    lm = sd["lm_head.weight"]
    assert abs(lm.std() * H**0.5 / LM_HEAD_STD - 1) < 0.05
    q = sd["model.layers.0.self_attn.q_proj.weight"]
    assert 0.8 < q.std() * H**0.5 < 1.2
    norm = sd["model.layers.0.input_layernorm.weight"]
    assert 0.8 < norm.mean() < 1.2
    # MXFP4 scales vary (several exponents in use) and stay near the target
    name = "model.layers.0.mlp.experts.gate_up_proj_scales"
    scales = load_tensor(read_header(_file_of(make_ckpt("tiny2"), name))[name])
    assert len(torch.unique(scales)) >= 3  # e0, e0+1 and outliers


def _file_of(d, name):
    with open(os.path.join(d, INDEX_FILE)) as f:
        return os.path.join(d, json.load(f)["weight_map"][name])


def test_tiny_is_fast(tmp_path):
    t0 = time.process_time()  # CPU seconds of this process: robust to other jobs on the machine
    write_random_checkpoint(preset("tiny"), tmp_path)
    cpu = time.process_time() - t0
    print(f"tiny checkpoint: {cpu:.2f} CPU s")
    assert cpu < 3.0


def test_writer_surfaces_producer_errors(tmp_path):
    import pytest

    from dayzero.weights.safetensors_io import TensorSource, write_sharded

    def bad():
        yield torch.zeros(2, 4)
        raise OSError("disk on fire")

    def short():
        yield torch.zeros(1, 4)

    for produce, err in ((bad, OSError), (short, RuntimeError)):
        with pytest.raises(err):
            write_sharded(tmp_path, [TensorSource("x", (4, 4), torch.float32, produce)], 1 << 20)
        assert not any(p.name.endswith(".safetensors") for p in tmp_path.iterdir())
