"""Model configuration read from an HF gpt-oss ``config.json``, plus presets."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field


class ConfigError(ValueError):
    """A config.json that is missing, unreadable or inconsistent; the message names the file."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 150000.0
    factor: float = 32.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = False


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 24
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 64
    num_local_experts: int = 32
    num_experts_per_tok: int = 4
    sliding_window: int = 128
    layer_types: tuple[str, ...] = ()
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 7.0
    max_position_embeddings: int = 131072
    rope: RopeConfig = field(default_factory=RopeConfig)
    eos_token_id: int | tuple[int, ...] = 200002
    pad_token_id: int = 199999
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if not self.layer_types:
            types = tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", types)
        self.validate()

    # ---- derived -------------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    def validate(self, source: str = "<config>") -> None:
        def bad(msg: str) -> ConfigError:
            return ConfigError(f"{source}: {msg}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise bad(f"{name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise bad(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                      f"num_key_value_heads ({self.num_key_value_heads})")
        if self.num_experts_per_tok > self.num_local_experts:
            raise bad(f"num_experts_per_tok ({self.num_experts_per_tok}) > num_local_experts ({self.num_local_experts})")
        if len(self.layer_types) != self.num_hidden_layers:
            raise bad(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        for t in self.layer_types:
            if t not in ("sliding_attention", "full_attention"):
                raise bad(f"unknown layer type {t!r} (expected sliding_attention or full_attention)")
        if self.intermediate_size % 32 or self.hidden_size % 32:
            raise bad("hidden_size and intermediate_size must be multiples of 32 (MXFP4 block)")

    # ---- HF config.json ------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "<config>") -> "ModelConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: top level must be a JSON object")
        mt = d.get("model_type")
        if mt is not None and mt != "gpt_oss":
            raise ConfigError(f"{source}: model_type is {mt!r}, expected 'gpt_oss'")
        rs = d.get("rope_scaling") or d.get("rope_parameters") or {}
        if not isinstance(rs, dict):
            raise ConfigError(f"{source}: rope_scaling must be an object")
        try:
            rope = RopeConfig(
                theta=float(d.get("rope_theta", rs.get("rope_theta", 150000.0))),
                factor=float(rs.get("factor", 32.0)),
                original_max_position_embeddings=int(rs.get("original_max_position_embeddings",
                                                            d.get("initial_context_length", 4096))),
                beta_fast=float(rs.get("beta_fast", 32.0)),
                beta_slow=float(rs.get("beta_slow", 1.0)),
                truncate=bool(rs.get("truncate", False)),
            )
            kwargs = dict(rope=rope)
            for f in dataclasses.fields(cls):
                if f.name == "rope":
                    continue
                key = f.name
                if key == "num_experts_per_tok" and key not in d and "experts_per_token" in d:
                    key = "experts_per_token"
                if key in d:
                    v = d[key]
                    if f.name == "layer_types":
                        v = tuple(v)
                    elif f.name == "eos_token_id" and isinstance(v, list):
                        v = tuple(v)
                    kwargs[f.name] = v
            required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_local_experts", "vocab_size")
            missing = [k for k in required if k not in d]
            if missing:
                raise ConfigError(f"{source}: missing required key(s) {', '.join(missing)}")
            for k in ("rms_norm_eps", "swiglu_limit"):
                if k in kwargs:
                    kwargs[k] = float(kwargs[k])
            cfg = cls(**kwargs)
        except ConfigError as e:
            msg = str(e)  # __post_init__ validates without knowing the file: name it here
            if msg.startswith("<config>:") and source != "<config>":
                raise ConfigError(source + msg[len("<config>"):]) from None
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{source}: {e}") from None
        cfg.validate(source)
        return cfg

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ModelConfig":
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config.json not found") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_hf_dict(d, source=path)

    def to_hf_dict(self) -> dict:
        """The config.json of a real gpt-oss checkpoint (with the MXFP4 quantization_config)."""
        return {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": True,
            "attention_dropout": 0.0,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "experts_per_token": self.num_experts_per_tok,
            "num_experts_per_tok": self.num_experts_per_tok,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initial_context_length": self.rope.original_max_position_embeddings,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_types": list(self.layer_types),
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_local_experts": self.num_local_experts,
            "output_router_logits": False,
            "quantization_config": {
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4",
            },
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": {
                "beta_fast": self.rope.beta_fast, "beta_slow": self.rope.beta_slow, "factor": self.rope.factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
                "rope_type": "yarn", "truncate": self.rope.truncate,
            },
            "rope_theta": self.rope.theta,
            "router_aux_loss_coef": 0.9,
            "sliding_window": self.sliding_window,
            "swiglu_limit": self.swiglu_limit,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }


PRESETS: dict[str, ModelConfig] = {
    "20b": ModelConfig(),
    "120b": ModelConfig(num_hidden_layers=36, num_local_experts=128),
    # tiny: the embedded default and most tests; vocab covers the Harmony special tokens (< 201088)
    "tiny": ModelConfig(vocab_size=201088, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2),
    # tiny2: differs from tiny in layers, experts and top-k (test oracle comparisons)
    "tiny2": ModelConfig(vocab_size=4096, hidden_size=96, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=32, num_local_experts=6,
                         num_experts_per_tok=3, eos_token_id=4094, pad_token_id=4095),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
