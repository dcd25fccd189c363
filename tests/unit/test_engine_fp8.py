"""FP8 engine (128x128 weight blocks, 1x128 activation groups, emulated in torch) against the fp32
reference on the same checkpoint over 1024 positions; FP8 from an HF dir (quantize at load) and
from a converted FP8 dir give the same model."""

from __future__ import annotations

import pytest
import torch

from dayzero.config import ModelConfig
from dayzero.kvcache import KVCacheManager, KVCacheSpec
from dayzero.model.reference import ReferenceModel
from dayzero.runtime.model_runner import ModelRunner, SeqChunk
from dayzero.weights.hf_reader import read_hf_checkpoint
from dayzero.weights.loader import load_model

# 320 = 2*128 + 64 and I = 192 = 128 + 64: partial 128-blocks everywhere, as 2880 has
FP8_CFG = ModelConfig(vocab_size=2048, hidden_size=320, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                      num_experts_per_tok=2, eos_token_id=1, pad_token_id=0)
N_POS = 1024


def _engine_logits(model, ids: list[int], chunk: int = 256) -> torch.Tensor:
    kv = KVCacheManager(KVCacheSpec.from_model(model.cfg, 16, model.act_dtype), num_blocks=len(ids) // 16 + 4,
                        max_seqs=1)
    runner = ModelRunner(model, kv)
    kv.ensure("s", len(ids))
    return torch.cat([runner.run([SeqChunk("s", ids[s:s + chunk], s, "all")])[0] for s in range(0, len(ids), chunk)])


def _compare(label: str, got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    cos = torch.nn.functional.cosine_similarity(got.float(), ref.float(), dim=-1)
    top1 = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    print(f"{label}: cosine mean {float(cos.mean()):.5f} min {float(cos.min()):.5f}, top-1 agreement {top1:.3f}"
          f" over {got.shape[0]} positions")
    return float(cos.mean()), float(cos.min()), top1


@pytest.fixture(scope="module")
def fp8_setup(make_ckpt):
    d = make_ckpt(FP8_CFG)
    cfg, sd = read_hf_checkpoint(d)
    ids = torch.randint(0, cfg.vocab_size, (N_POS,), generator=torch.Generator().manual_seed(8)).tolist()
    ref = ReferenceModel(cfg, sd).forward(torch.tensor(ids))          # fp32 oracle [N, V]
    assert ref.std(-1).mean() > 1.0  # trained-like scales: logits are not flat
    return d, ids, ref


def test_fp8_engine_close_to_reference(fp8_setup):
    d, ids, ref = fp8_setup
    fp8 = _engine_logits(load_model(d, dtype="fp8", max_positions=N_POS), ids)
    bf16 = _engine_logits(load_model(d, dtype="bfloat16", max_positions=N_POS), ids)
    mean8, min8, top8 = _compare("fp8 engine vs fp32 reference", fp8, ref)
    mean16, _, top16 = _compare("bf16 engine vs fp32 reference", bf16, ref)
    _compare("fp8 engine vs bf16 engine", fp8, bf16)
    assert mean8 >= 0.99 and min8 >= 0.95
    assert mean16 >= mean8  # FP8 loses more than bf16 alone
    assert top8 > 0.5


def test_fp8_dir_equals_quantize_at_load(fp8_setup, tmp_path):
    from dayzero.weights.convert import convert_checkpoint

    d, ids, ref = fp8_setup
    out = tmp_path / "fp8"
    convert_checkpoint(d, out, progress=False)
    ids = ids[:200]
    at_load = _engine_logits(load_model(d, dtype="fp8", max_positions=256), ids)
    from_dir = _engine_logits(load_model(out, dtype="fp8", max_positions=256), ids)
    err = float((at_load - from_dir).abs().max() / at_load.abs().max())
    assert err < 1e-5, err
    # an FP8 dir loaded as bf16 (dequantized at load) stays close to the fp32 reference
    deq = _engine_logits(load_model(out, dtype="bfloat16", max_positions=256), ids)
    assert _compare("fp8 dir dequantized to bf16 vs fp32 reference", deq, ref[:200])[0] >= 0.99
