"""FP8 e4m3 block quantization: exact block-scale semantics, round-trip error table, conversion."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from dayzero.model.reference import ReferenceModel
from dayzero.weights.convert import FP8_QUANT_CONFIG, FP8Checkpoint, convert_checkpoint, read_fp8_checkpoint
from dayzero.weights.fp8 import (FP8_MAX, dequantize_act_group, dequantize_weight_block, quantize_act_group,
                                 quantize_weight_block)
from dayzero.weights.hf_reader import read_hf_checkpoint
from dayzero.weights.names import is_fp8_weight, scale_name
from dayzero.weights.safetensors_io import INDEX_FILE


def test_partial_edge_blocks_scaled_over_real_extent():
    w = torch.randn(2, 300, 200, generator=torch.Generator().manual_seed(0))
    q, s = quantize_weight_block(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and s.shape == (2, 3, 2)
    assert s.dtype == torch.float32
    for e in range(2):
        for bi, rows in enumerate((slice(0, 128), slice(128, 256), slice(256, 300))):
            for bj, cols in enumerate((slice(0, 128), slice(128, 200))):
                blk = w[e, rows, cols]
                assert s[e, bi, bj] == blk.abs().max() / FP8_MAX
                assert q[e, rows, cols].float().abs().max() == FP8_MAX  # every block uses the full range
    d = dequantize_weight_block(q, s)
    assert d.dtype == torch.float32 and d.shape == w.shape


def test_elementwise_error_bound():
    # e4m3 keeps 3 mantissa bits: |err| <= 2^-4 |w| (normals), <= 2^-10 * scale (subnormals)
    w = torch.randn(257, 2880, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 1, 2880)
    q, s = quantize_weight_block(w)
    err = (dequantize_weight_block(q, s) - w).abs()
    scale = s.repeat_interleave(128, 0)[:257].repeat_interleave(128, 1)[:, :2880]
    assert (err <= torch.maximum(w.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)).all()


def test_zero_block_and_activation_groups():
    q, s = quantize_weight_block(torch.zeros(130, 10))
    assert torch.equal(s, torch.ones(2, 1)) and torch.equal(q.float(), torch.zeros(130, 10))
    x = torch.randn(7, 2880, generator=torch.Generator().manual_seed(2))
    xq, xs = quantize_act_group(x)
    assert xs.shape == (7, 23)  # 2880 = 22 * 128 + 64: last group partial
    assert torch.equal(xs[:, -1], x[:, 2816:].abs().amax(-1) / FP8_MAX)
    assert torch.equal(xs[:, 0], x[:, :128].abs().amax(-1) / FP8_MAX)
    xd = dequantize_act_group(xq, xs)
    assert float((xd - x).norm() / x.norm()) < 0.04
    with pytest.raises(ValueError):
        dequantize_act_group(xq, xs[:, :-1])


def _kind(name: str) -> str:
    name = re.sub(r"model\.layers\.\d+\.", "", name)
    return name.replace(".weight", "").replace("self_attn.", "").replace("mlp.experts.", "experts.")


@pytest.mark.parametrize("preset", ["tiny", "tiny2"])
def test_convert_round_trip_table(make_ckpt, tmp_path, preset):
    hf_dir = make_ckpt(preset)
    out = tmp_path / "fp8"
    convert_checkpoint(hf_dir, out, max_shard_bytes=1_000_000, progress=False)
    with open(out / "config.json") as f:
        assert json.load(f)["quantization_config"] == FP8_QUANT_CONFIG
    with open(out / INDEX_FILE) as f:
        assert len(set(json.load(f)["weight_map"].values())) > 1  # sharded
    cfg, ref = read_hf_checkpoint(hf_dir)
    cfg8, sd = read_fp8_checkpoint(out)
    assert cfg8 == cfg
    assert set(sd) == set(ref) | {scale_name(n) for n in ref if is_fp8_weight(n)}
    rows: dict[str, list[float]] = {}
    for name, w in ref.items():
        if not is_fp8_weight(name):
            assert sd[name].dtype == torch.bfloat16 and torch.equal(sd[name].float(), w)  # bf16 source: exact
            continue
        q, s = sd[name], sd[scale_name(name)]
        assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
        # the streamed conversion (row bands, one expert at a time) equals quantizing the whole tensor
        q_all, s_all = quantize_weight_block(w)
        assert torch.equal(s, s_all) and torch.equal(q.view(torch.uint8), q_all.view(torch.uint8)), name
        d = dequantize_weight_block(q, s)
        r = rows.setdefault(_kind(name), [0.0, 0.0, 0.0, 0])
        r[0] += float((d - w).pow(2).sum())
        r[1] += float(w.pow(2).sum())
        r[2] = max(r[2], float((d - w).abs().max()))
        r[3] += 1
    print(f"\nFP8 e4m3 128x128 round trip, preset {preset} (H={cfg.hidden_size}, I={cfg.intermediate_size})")
    print(f"{'tensor kind':<24}{'count':>6}{'rel Frobenius':>16}{'max abs err':>14}")
    for kind, (e2, w2, mx, n) in sorted(rows.items()):
        rel = (e2 / w2) ** 0.5
        print(f"{kind:<24}{n:>6}{rel:>16.4%}{mx:>14.3e}")
        assert 0.005 < rel < 0.04, kind  # e4m3: ~2-3 % for Gaussian-like weights; 0 would mean no quantization
    assert set(rows) == {"q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_up_proj", "experts.down_proj",
                         "lm_head"}


def test_fp8_weights_keep_reference_logits(make_ckpt, tmp_path):
    """Weight-only FP8 in the reference model vs fp32 weights: logits stay close (cosine, top-1)."""
    hf_dir = make_ckpt("tiny2")
    convert_checkpoint(hf_dir, tmp_path / "fp8", progress=False)
    cfg, ref_sd = read_hf_checkpoint(hf_dir)
    _, sd8 = read_fp8_checkpoint(tmp_path / "fp8")
    deq = {n: (dequantize_weight_block(t, sd8[scale_name(n)]) if is_fp8_weight(n) else t.float())
           for n, t in sd8.items() if not n.endswith("_scale")}
    ids = torch.randint(0, cfg.vocab_size, (256,), generator=torch.Generator().manual_seed(5))
    a = ReferenceModel(cfg, ref_sd).forward(ids)
    b = ReferenceModel(cfg, deq).forward(ids)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
    top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    print(f"\nreference fp32 vs FP8 weights (tiny2, 256 positions): cosine mean {cos.mean():.5f} "
          f"min {cos.min():.5f}, top-1 agreement {top1:.3f}")
    assert cos.mean() >= 0.99 and top1 >= 0.8


def test_fp8_reader_rejects_hf_dir(make_ckpt):
    from dayzero.config import ConfigError

    with pytest.raises(ConfigError, match="dayzero convert"):
        FP8Checkpoint(make_ckpt("tiny2"))


def test_convert_cli(make_ckpt, tmp_path, capsys):
    from dayzero.cli import main

    assert main(["convert", make_ckpt("tiny2"), os.fspath(tmp_path / "o")]) == 0
    assert "wrote the FP8 serving checkpoint" in capsys.readouterr().out
    assert main(["convert", os.fspath(tmp_path / "missing"), os.fspath(tmp_path / "o2")]) == 1
    assert "config.json not found" in capsys.readouterr().err


def test_round_trip_table_20b_shapes():
    """Real gpt-oss-20b shapes (2880 = 22 * 128 + 64: partial edge blocks), values from the random
    checkpoint generator: the first chunk (<= 8M elements, whole rows) of layer 0's attention
    weights and lm_head, and layer 0's first expert."""
    from dayzero.config import preset
    from dayzero.weights.mxfp4 import dequantize_mxfp4
    from dayzero.weights.random_checkpoint import tensor_sources

    src = {s.name: s for s in tensor_sources(preset("20b"), seed=0)}
    first = lambda name: next(iter(src[name].produce())).float()  # noqa: E731  first chunk only
    p = "model.layers.0."
    weights = {k: first(p + f"self_attn.{k}.weight") for k in ("q_proj", "k_proj", "v_proj", "o_proj")}
    for proj in ("gate_up_proj", "down_proj"):
        blocks = next(iter(src[p + f"mlp.experts.{proj}_blocks"].produce()))
        scales = next(iter(src[p + f"mlp.experts.{proj}_scales"].produce()))
        weights[f"expert 0 {proj}"] = dequantize_mxfp4(blocks, scales)[0]
    weights["lm_head (first rows)"] = first("lm_head.weight")
    print("\nFP8 e4m3 128x128 round trip, gpt-oss-20b shapes")
    print(f"{'tensor':<24}{'shape':>14}{'rel Frobenius':>16}{'max abs err':>14}")
    for name, w in weights.items():
        q, s = quantize_weight_block(w)
        d = dequantize_weight_block(q, s)
        rel = float((d - w).norm() / w.norm())
        print(f"{name:<24}{'x'.join(map(str, w.shape)):>14}{rel:>16.4%}{float((d - w).abs().max()):>14.3e}")
        assert 0.005 < rel < 0.04, name
    assert weights["expert 0 gate_up_proj"].shape == (5760, 2880)


@pytest.mark.gpu
def test_convert_on_cuda_equals_cpu(make_ckpt, tmp_path):
    hf_dir = make_ckpt("tiny2")
    convert_checkpoint(hf_dir, tmp_path / "cpu", progress=False, device="cpu")
    convert_checkpoint(hf_dir, tmp_path / "cuda", progress=False, device="cuda")
    _, a = read_fp8_checkpoint(tmp_path / "cpu")
    _, b = read_fp8_checkpoint(tmp_path / "cuda")
    for name in a:
        x, y = a[name], b[name]
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), name
