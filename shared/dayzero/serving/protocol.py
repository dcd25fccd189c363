"""Conversions between the gRPC messages and the engine's types, shared by the workers."""

from __future__ import annotations

import hashlib
import json
import os

from dayzero.rpc.v1 import common_pb2
from dayzero.runtime.sampling import SamplingParams

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
          "abort": common_pb2.FINISH_REASON_ABORT}


def sampling_from_proto(p: common_pb2.SamplingParams) -> SamplingParams:
    """Proto -> engine params (proto zeros mean "off"); raises ValueError on invalid values."""
    params = SamplingParams(
        max_tokens=int(p.max_tokens), temperature=float(p.temperature),
        top_p=float(p.top_p) if 0 < p.top_p < 1 else 1.0, top_k=int(p.top_k), min_p=float(p.min_p),
        seed=int(p.seed) if p.HasField("seed") else None, stop_token_ids=tuple(int(t) for t in p.stop_token_ids),
        ignore_eos=bool(p.ignore_eos), logprobs=int(p.top_logprobs) if p.logprobs else None,
        presence_penalty=float(p.presence_penalty), frequency_penalty=float(p.frequency_penalty),
        logit_bias=tuple(sorted((int(t), float(b)) for t, b in p.logit_bias.items())),
        allowed_prefixes=tuple(tuple(int(t) for t in seq.token_ids) for seq in p.allowed_prefixes),
        json_schema=str(p.json_schema), json_end_ids=tuple(int(t) for t in p.json_end_ids),
        prefix_json_schemas=tuple(str(s) for s in p.prefix_json_schemas))
    if p.top_p < 0 or p.top_p > 1:
        raise ValueError(f"invalid sampling parameters: top_p must be in [0, 1], got {p.top_p}")
    params.validate()
    return params


def token_logprob(token_id: int, logprob: float | None, top: list[tuple[int, float]]) -> common_pb2.TokenLogprob:
    return common_pb2.TokenLogprob(token_id=token_id, logprob=float(logprob or 0.0),
                                   top=[common_pb2.TopLogprob(token_id=t, logprob=float(lp)) for t, lp in top])


def model_id(model_dir: str) -> str:
    """A short digest naming a checkpoint: its config.json plus the names and sizes of its weight
    files (two workers serving copies of the same checkpoint agree; different models do not)."""
    h = hashlib.sha256()
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        h.update(json.dumps(json.load(f), sort_keys=True).encode())
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            h.update(f"{name}:{os.path.getsize(os.path.join(model_dir, name))}".encode())
    return h.hexdigest()[:16]
