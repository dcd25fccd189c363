"""Structured output: a JSON Schema turned into a per-step token mask (llguidance).

``GrammarCompiler`` builds, once per engine and only when a request first asks for it, llguidance's
tokenizer over the model's vocabulary: the o200k_base byte-pair ranks (the verified vocabulary file
that ``dayzero.vocab`` resolves) plus the Harmony special tokens (names and ids from openai-harmony).
The schema becomes a grammar as ``dayzero.json_grammar`` defines (the frontend checks it the same
way). Each structured request gets its own ``Matcher``: ``allowed()`` is the boolean mask of the tokens
that keep the output a prefix of a JSON text valid under the schema (once the text may end, also
the request's end tokens: ``<|return|>`` after an answer, ``<|call|>`` after tool-call arguments);
``advance(token)`` moves it on. A request that sampled a token outside the
mask (it cannot happen through the sampler) is reported by ``advance`` returning False.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np
import torch

from dayzero.json_grammar import GrammarError, json_grammar, llguidance_module

__all__ = ["GrammarCompiler", "GrammarError", "Matcher"]
# o200k_base's pre-tokenisation pattern (the published tiktoken definition); llguidance uses it only
# to tokenise text it forces, never to compute masks
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def harmony_tokenizer_parts() -> tuple[dict[bytes, int], dict[str, int], list[int]]:
    """(byte-pair ranks of o200k_base, Harmony special token name -> id, Harmony's stop token ids) from
    the resolved vocabulary."""
    from dayzero.vocab import VOCAB_FILE, VocabError, load_harmony_encoding

    try:
        enc, res = load_harmony_encoding(allow_download=False)
    except VocabError as e:
        raise GrammarError(f"structured output needs the Harmony vocabulary: {e}") from None
    ranks: dict[bytes, int] = {}
    with open(res.folder / VOCAB_FILE, "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    specials = {name: enc.encode(name, allowed_special="all")[0] for name in enc.special_tokens_set}
    return ranks, specials, sorted(enc.stop_tokens())


@dataclass
class Matcher:
    """One request's position in its grammar."""

    inner: object                       # llguidance.LLMatcher
    vocab_size: int
    end_ids: tuple[int, ...] = ()       # what may follow the JSON (only once it is complete)
    barred: tuple[int, ...] = ()        # end tokens of the tokenizer this request may not end with
    _words: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self._words = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Bool mask [V] of the tokens that may come next."""
        import llguidance.numpy as lln

        lln.fill_next_token_bitmask(self.inner, self._words[None, :])
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[:self.vocab_size].astype(np.bool_)
        bits[list(self.barred)] = False
        return torch.from_numpy(bits).to(device)

    def advance(self, token_id: int) -> bool:
        return bool(self.inner.consume_token(token_id))

    def ends(self, token_id: int) -> bool:
        """Whether ``token_id`` (just taken) is one of this request's end tokens: the JSON is complete."""
        return token_id in self.end_ids

    @property
    def error(self) -> str | None:
        return self.inner.get_error() if self.inner.is_error() else None


class GrammarCompiler:
    """Per engine: the llguidance tokenizer over the model's vocabulary (built on first use)."""

    def __init__(self, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = set(eos_ids)
        self.end_ids: list[int] = []     # what may end a JSON text: the model's eos + Harmony's stop tokens
        self._tokenizer = None

    def tokenizer(self):
        if self._tokenizer is None:
            llg = llguidance_module()
            ranks, specials, stops = harmony_tokenizer_parts()
            # reserved special ids past the model's vocabulary can never be sampled: left out
            specials = {name: i for name, i in specials.items() if i < self.vocab_size}
            self.end_ids = sorted(self.eos_ids | set(stops))
            top = max(ranks.values()) + 1
            if top > self.vocab_size or any(i not in specials.values() for i in self.end_ids):
                raise GrammarError(f"structured output needs the Harmony vocabulary (its {top} byte-pair tokens "
                                   f"and special tokens); this model has {self.vocab_size} tokens")
            self._tokenizer = llg.LLTokenizer.from_tiktoken(
                encoder=ranks, special_tokens=specials, pattern=O200K_PATTERN, eos_token=self.end_ids,
                n_vocab=self.vocab_size)
        return self._tokenizer

    def matcher(self, json_schema: str, end_ids: tuple[int, ...]) -> Matcher:
        """A fresh matcher for ``json_schema`` (JSON Schema as text) whose text may be followed only by one
        of ``end_ids``; GrammarError if it is not usable."""
        grammar = json_grammar(json_schema)
        llg = llguidance_module()
        tok = self.tokenizer()
        inner = llg.LLMatcher(tok, grammar)
        if inner.is_error():
            raise GrammarError(f"json_schema could not be compiled: {inner.get_error()}")
        if not set(end_ids) <= set(self.end_ids):
            raise GrammarError(f"json_end_ids {sorted(set(end_ids) - set(self.end_ids))} cannot end a JSON text "
                               f"here (allowed: {self.end_ids})")
        ends = tuple(sorted(set(end_ids)))
        return Matcher(inner, self.vocab_size, ends, tuple(sorted(set(self.end_ids) - set(ends))))
