"""Bad checkpoints and configs give one clear error naming the file and the tensor."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dayzero.config import ConfigError
from dayzero.weights.hf_reader import CheckpointError, HFCheckpoint, read_hf_checkpoint
from dayzero.weights.safetensors_io import INDEX_FILE

TENSOR = "model.layers.1.self_attn.k_proj.weight"
EXPERTS = "model.layers.0.mlp.experts.down_proj_blocks"


@pytest.fixture
def ckpt(make_ckpt, tmp_path):
    """A private copy of a tiny2 checkpoint split into several shards (safe to corrupt)."""
    d = tmp_path / "ckpt"
    shutil.copytree(make_ckpt("tiny2", 0, 200_000), d)
    return d


def shard_of(d, name):
    with open(os.path.join(d, INDEX_FILE)) as f:
        return os.path.join(d, json.load(f)["weight_map"][name])


def edit_config(d, fn):
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(path, "w") as f:
        json.dump(cfg, f)


def rewrite_shard(path, fn):
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def assert_clear(excinfo, *needles):
    msg = str(excinfo.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert excinfo.value.__cause__ is None or isinstance(excinfo.value.__cause__, (ValueError, OSError))
    assert "\n" not in msg


def test_good_checkpoint_reads(ckpt):
    cfg, sd = read_hf_checkpoint(ckpt)
    assert sd[TENSOR].shape == (cfg.kv_size, cfg.hidden_size)


def test_bad_json(ckpt):
    (ckpt / "config.json").write_text('{"hidden_size": 96,,}')
    with pytest.raises(ConfigError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, "config.json", "not valid JSON")


def test_missing_config(ckpt):
    os.remove(ckpt / "config.json")
    with pytest.raises(ConfigError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, "config.json", "not found")


@pytest.mark.parametrize("edit, needle", [
    (lambda c: c.pop("hidden_size"), "hidden_size"),
    (lambda c: c.pop("num_hidden_layers"), "num_hidden_layers"),
    (lambda c: c.update(hidden_size="96"), "hidden_size"),
    (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c: c.update(num_experts_per_tok=99), "num_experts_per_tok"),
    (lambda c: c.update(layer_types=["sliding_attention"]), "layer_types"),
    (lambda c: c.update(layer_types=5), "config.json"),
    (lambda c: c.update(rope_scaling="yarn"), "rope_scaling"),
    (lambda c: c.update(model_type="llama"), "model_type"),
])
def test_malformed_config(ckpt, edit, needle):
    edit_config(ckpt, edit)
    with pytest.raises(ConfigError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, "config.json", needle)


def test_config_does_not_match_tensors(ckpt):
    edit_config(ckpt, lambda c: c.update(intermediate_size=128))
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, "gate_up_proj_blocks", "shape", ".safetensors")


def test_missing_tensor_still_in_index(ckpt):
    path = shard_of(ckpt, TENSOR)
    rewrite_shard(path, lambda t: t.pop(TENSOR))
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, TENSOR, os.path.basename(path))


def test_missing_tensor_everywhere(ckpt):
    path = shard_of(ckpt, TENSOR)
    rewrite_shard(path, lambda t: t.pop(TENSOR))
    with open(ckpt / INDEX_FILE) as f:
        index = json.load(f)
    del index["weight_map"][TENSOR]
    with open(ckpt / INDEX_FILE, "w") as f:
        json.dump(index, f)
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, TENSOR, "missing")


def test_mis_shaped_tensor(ckpt):
    path = shard_of(ckpt, TENSOR)
    rewrite_shard(path, lambda t: t.update({TENSOR: t[TENSOR][:, :64].contiguous()}))
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, TENSOR, os.path.basename(path), "[32, 64]", "[32, 96]")


def test_wrong_dtype_experts(ckpt):
    path = shard_of(ckpt, EXPERTS)
    rewrite_shard(path, lambda t: t.update({EXPERTS: t[EXPERTS].to(torch.int8)}))
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, EXPERTS, os.path.basename(path), "dtype")


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_shard(ckpt, keep):
    path = shard_of(ckpt, "lm_head.weight")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, os.path.basename(path), "truncated", "tensor")


def test_truncated_header(ckpt):
    path = shard_of(ckpt, TENSOR)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, os.path.basename(path), "header")


def test_garbage_file(ckpt):
    path = shard_of(ckpt, TENSOR)
    with open(path, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\0" * 100)
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, os.path.basename(path), "corrupt")


def test_missing_shard(ckpt):
    path = shard_of(ckpt, TENSOR)
    os.remove(path)
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, os.path.basename(path), "missing")


def test_malformed_index(ckpt):
    (ckpt / INDEX_FILE).write_text('{"weight_map": 3}')
    with pytest.raises(CheckpointError) as e:
        HFCheckpoint(ckpt)
    assert_clear(e, INDEX_FILE)


def test_cli_reports_one_line(ckpt, tmp_path, capsys):
    from dayzero.cli import main

    os.remove(shard_of(ckpt, TENSOR))
    assert main(["convert", os.fspath(ckpt), os.fspath(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "missing" in err and "Traceback" not in err
