"""Sampling: request-side parameters and a batched sampler over requests with different parameters.

Per row of logits (float32, raw model output):
  * temperature 0 -> greedy (argmax; ties resolve to the lowest id);
  * otherwise logits / temperature, then in order: top-k (keep the k largest), top-p (keep the
    smallest prefix of the sorted distribution whose mass reaches p, renormalized after top-k),
    min-p (drop tokens whose probability < min_p * the largest probability); sample the rest.
  * randomness: a per-request ``torch.Generator`` reseeded at every step from (seed, step), so a
    request's tokens depend only on its seed, its logits and the step index: the same seed gives
    the same tokens whether the request runs alone, batched, or split over a prefill and a decode
    worker.
  * logprobs (when asked) are those of the raw model distribution (log_softmax of the logits,
    before temperature and filters): the sampled token's, and the ``n`` most likely alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) over the 64-bit seed space
_MASK63 = (1 << 63) - 1


@dataclass
class SamplingParams:
    """What a request asks of the sampler and the stopping rules (independent of any protocol)."""

    max_tokens: int = 16
    temperature: float = 0.0            # 0 = greedy
    top_p: float = 1.0                  # 1 = off
    top_k: int = 0                      # 0 = off
    min_p: float = 0.0                  # 0 = off
    seed: int | None = None             # None: a random seed is drawn when the request is added
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False            # True: the model's eos ids do not stop the request
    logprobs: int | None = None         # None: no logprobs; n >= 0: sampled token's + n alternatives

    def validate(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"invalid sampling parameters: {msg}")

        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise bad(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise bad(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise bad(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SampleRequest:
    """One row of a sampling batch: the request's params, its seed and its step index."""

    params: SamplingParams
    seed: int
    step: int


@dataclass
class Sample:
    token_id: int
    logprob: float | None = None                                 # of token_id under the raw distribution
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # n alternatives, most likely first


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampling distribution after temperature and filters, in sorted order.

    logits ``[B, V]`` fp32; per-row temperature (> 0), top_k (0 = off), top_p, min_p: ``[B]``.
    Returns ``(probs [B, V] over the sorted order, order [B, V] int64 token ids)``.
    """
    x = logits / temperature[:, None]
    sorted_x, order = x.sort(dim=-1, descending=True)                        # [B, V]
    V = x.shape[-1]
    rank = torch.arange(V, device=x.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
    sorted_x = sorted_x.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    before = probs.cumsum(-1) - probs                                      # mass of strictly better tokens
    probs = probs.masked_fill((before >= top_p[:, None]) & (rank > 0), 0.0)
    probs = probs.masked_fill(probs < min_p[:, None] * probs[:, :1], 0.0)
    return probs / probs.sum(-1, keepdim=True), order


class Sampler:
    """Samples one token per row of a logits batch; each row has its own ``SampleRequest``."""

    def __call__(self, logits: torch.Tensor, reqs: list[SampleRequest]) -> list[Sample]:
        """logits ``[B, V]`` (any float dtype; used in fp32) -> one ``Sample`` per row."""
        logits = logits.float()
        B = logits.shape[0]
        if B != len(reqs):
            raise ValueError(f"{B} logit rows for {len(reqs)} requests")
        tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
        greedy = [i for i, r in enumerate(reqs) if r.params.greedy]
        rand = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if greedy:
            tokens[greedy] = logits[greedy].argmax(-1)
        if rand:
            dev = logits.device
            ps = [reqs[i].params for i in rand]
            probs, order = filtered_probs(
                logits[rand],
                torch.tensor([p.temperature for p in ps], device=dev),
                torch.tensor([p.top_k for p in ps], device=dev),
                torch.tensor([p.top_p for p in ps], device=dev),
                torch.tensor([p.min_p for p in ps], device=dev))
            gen = torch.Generator(device=dev)
            for j, i in enumerate(rand):
                r = reqs[i]
                gen.manual_seed((r.seed * _MIX + r.step) & _MASK63)
                pick = torch.multinomial(probs[j], 1, generator=gen)
                tokens[i] = order[j, pick[0]]
        out = [Sample(int(t)) for t in tokens.tolist()]
        want = [i for i, r in enumerate(reqs) if r.params.logprobs is not None]
        if want:
            lp = torch.log_softmax(logits[want], dim=-1)                     # [n, V]
            n_top = max(reqs[i].params.logprobs for i in want)
            top_v, top_i = lp.topk(n_top, dim=-1) if n_top else (None, None)
            for j, i in enumerate(want):
                out[i].logprob = float(lp[j, out[i].token_id])
                n = reqs[i].params.logprobs
                if n:
                    out[i].top_logprobs = list(zip(top_i[j, :n].tolist(), top_v[j, :n].tolist()))
        return out
