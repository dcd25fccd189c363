"""ModelConfig against HF transformers' GptOssConfig, and the presets' real shapes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dayzero.config import PRESETS, ConfigError, ModelConfig, preset

transformers = pytest.importorskip("transformers")


def test_transformers_default_config_is_our_120b():
    # transformers' GptOssConfig defaults are gpt-oss-120b's shapes (it leaves token ids unset)
    ours = ModelConfig.from_hf_dict(transformers.GptOssConfig().to_dict())
    assert dataclasses.replace(ours, eos_token_id=200002, pad_token_id=199999) == preset("120b")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_to_hf_dict_round_trips_and_transformers_reads_it(name, tmp_path):
    cfg = preset(name)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert ModelConfig.from_json(tmp_path) == cfg
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert hf.model_type == "gpt_oss"
    for ours, theirs in (("hidden_size", "hidden_size"), ("num_hidden_layers", "num_hidden_layers"),
                         ("num_local_experts", "num_local_experts"), ("num_experts_per_tok", "num_experts_per_tok"),
                         ("num_attention_heads", "num_attention_heads"), ("head_dim", "head_dim"),
                         ("num_key_value_heads", "num_key_value_heads"), ("vocab_size", "vocab_size"),
                         ("sliding_window", "sliding_window"), ("intermediate_size", "intermediate_size")):
        assert getattr(cfg, ours) == getattr(hf, theirs), ours
    assert list(cfg.layer_types) == list(hf.layer_types)
    rp = hf.rope_parameters
    assert (rp["rope_type"], rp["factor"], rp["beta_fast"], rp["beta_slow"], rp["rope_theta"],
            rp["original_max_position_embeddings"], rp["truncate"]) == (
        "yarn", cfg.rope.factor, cfg.rope.beta_fast, cfg.rope.beta_slow, cfg.rope.theta,
        cfg.rope.original_max_position_embeddings, cfg.rope.truncate)
    if cfg.pad_token_id is not None:
        assert 0 <= cfg.pad_token_id < cfg.vocab_size  # transformers' Embedding needs it in range


def test_20b_shapes():
    c = preset("20b")
    assert (c.num_hidden_layers, c.num_local_experts, c.num_experts_per_tok) == (24, 32, 4)
    assert (c.q_size, c.kv_size, c.hidden_size) == (4096, 512, 2880)
    assert c.layer_types[:2] == ("sliding_attention", "full_attention") and c.is_sliding(0)
    assert preset("120b").num_local_experts == 128 and preset("120b").num_hidden_layers == 36


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("7b")
