"""hf_reader: canonical names, lazy iteration, and transformers' own (dequantized) save format."""

from __future__ import annotations

import json

import torch

from dayzero.weights.hf_reader import HFCheckpoint, canonical_shapes, iter_hf_checkpoint, read_hf_checkpoint


def test_canonical_names_shapes_and_lazy_iteration(make_ckpt):
    d = make_ckpt("tiny2")
    cfg, sd = read_hf_checkpoint(d)
    shapes = canonical_shapes(cfg)
    assert list(sd) == list(shapes)
    assert {k: tuple(v.shape) for k, v in sd.items()} == shapes
    assert all(v.dtype == torch.float32 for v in sd.values())
    lazy = iter_hf_checkpoint(d, dtype=torch.bfloat16)
    first_name, first = next(lazy)  # nothing else is read yet
    assert first_name == "model.embed_tokens.weight" and first.dtype == torch.bfloat16
    rest = dict(lazy)
    assert len(rest) == len(sd) - 1
    # MXFP4 values are exact in bf16: the bf16 read equals the fp32 read for the experts
    k = "model.layers.2.mlp.experts.down_proj"
    assert torch.equal(rest[k].float(), sd[k])
    sub = dict(iter_hf_checkpoint(d, names=[k]))
    assert list(sub) == [k] and torch.equal(sub[k], sd[k])


def test_read_rows_matches_full_read(make_ckpt):
    ckpt = HFCheckpoint(make_ckpt("tiny2"))
    k = "model.layers.1.mlp.experts.gate_up_proj"
    full = ckpt.read(k)
    assert torch.equal(ckpt.read_rows(k, 2, 4), full[2:4])
    assert torch.equal(ckpt.read_rows("lm_head.weight", 10, 20), ckpt.read("lm_head.weight")[10:20])


def test_reads_transformers_dequantized_save(make_ckpt, hf_model, tmp_path):
    """transformers saves a dequantized model with experts as [E, in, out] and no MXFP4: same values."""
    d = make_ckpt("tiny2")
    hf_model(d).save_pretrained(tmp_path / "saved")
    with open(tmp_path / "saved" / "config.json") as f:
        saved_q = json.load(f).get("quantization_config")
    _, ours = read_hf_checkpoint(d)
    ckpt = HFCheckpoint(tmp_path / "saved")
    assert not ckpt.mxfp4, saved_q
    theirs = dict(ckpt.iter_tensors())
    assert theirs.keys() == ours.keys()
    for k in ours:
        assert torch.equal(theirs[k], ours[k]), k
