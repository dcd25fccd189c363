"""Engine weight loading: name map, FP8 companions, and clear errors for bad tensors."""

from __future__ import annotations

import pytest
import torch

from dayzero.model.layers import WeightLoadError
from dayzero.model.transformer import GptOssForEngine
from dayzero.weights.fp8 import quantize_weight_block
from dayzero.weights.hf_reader import read_hf_checkpoint
from dayzero.weights.loader import load_weights
from dayzero.weights.names import is_fp8_weight, scale_name


@pytest.fixture(scope="module")
def tiny2_sd(make_ckpt):
    return read_hf_checkpoint(make_ckpt("tiny2"))


def _model(cfg, dtype="float32"):
    return GptOssForEngine(cfg, dtype=dtype, max_positions=64)


def test_every_parameter_is_a_canonical_name(tiny2_sd):
    cfg, sd = tiny2_sd
    m = _model(cfg, "fp8")
    params = {n for n, _ in m.named_parameters()}
    scales = {n for n in params if n.endswith("_scale")}
    assert params - scales == set(sd)
    assert len(scales) == sum(is_fp8_weight(n) for n in sd)


def test_loads_fp8_pairs_in_any_order(tiny2_sd):
    cfg, sd = tiny2_sd
    fp8_sd = {}
    for n, t in sd.items():
        if is_fp8_weight(n):
            q, s = quantize_weight_block(t)
            fp8_sd[scale_name(n)] = s  # scale first for some, after for others
            fp8_sd[n] = q
        else:
            fp8_sd[n] = t.to(torch.bfloat16)
    a, b = _model(cfg, "fp8"), _model(cfg, "fp8")
    load_weights(a, fp8_sd.items())
    load_weights(b, reversed(list(fp8_sd.items())))
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p.float(), q.float()), n
    # a dense model from FP8 tensors: dequantized at load
    c = _model(cfg, "float32")
    load_weights(c, fp8_sd.items())
    w = "model.layers.0.self_attn.q_proj.weight"
    assert (c.get_parameter(w) - sd[w]).abs().max() < 0.07 * sd[w].abs().max()


@pytest.mark.parametrize("break_it,msg", [
    (lambda sd: sd.pop("model.layers.1.mlp.router.bias"), "missing tensor(s): model.layers.1.mlp.router.bias"),
    (lambda sd: sd.__setitem__("model.layers.0.self_attn.sinks", torch.zeros(3)),
     "tensor model.layers.0.self_attn.sinks: shape [3] does not match the model's [4]"),
    (lambda sd: sd.__setitem__("model.layers.0.mlp.experts.down_proj", torch.zeros(6, 64, 96)),
     "tensor model.layers.0.mlp.experts.down_proj: shape [6, 64, 96]"),
    (lambda sd: sd.__setitem__("model.extra.weight", torch.zeros(1)), "unexpected tensor(s)"),
    (lambda sd: sd.__setitem__("lm_head.weight", quantize_weight_block(sd["lm_head.weight"])[0]),
     "lm_head.weight is float8 but lm_head.weight_scale is missing"),
])
def test_bad_tensors_name_themselves(tiny2_sd, break_it, msg):
    cfg, sd = tiny2_sd
    sd = dict(sd)
    break_it(sd)
    with pytest.raises(WeightLoadError) as e:
        load_weights(_model(cfg), sd.items(), source="ckpt-dir")
    assert msg in str(e.value) and str(e.value).startswith("ckpt-dir: ")
