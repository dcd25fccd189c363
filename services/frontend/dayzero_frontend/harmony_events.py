"""What the Harmony output parser emits, and the special-token ids it watches."""

from __future__ import annotations

from dataclasses import dataclass

from openai_harmony import HarmonyEncoding


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallBegin:
    index: int  # position among this choice's tool calls
    call_id: str
    name: str


@dataclass
class ToolCallDelta:
    index: int
    arguments: str


Event = ReasoningDelta | ContentDelta | ToolCallBegin | ToolCallDelta


@dataclass
class ToolCall:
    call_id: str
    name: str
    arguments: str = ""


@dataclass
class HarmonyTokens:
    """Ids of Harmony's structural special tokens, looked up through the encoding."""

    start: int
    end: int
    message: int
    channel: int
    constrain: int
    return_: int
    call: int
    endoftext: int
    vocab_size: int  # ids run up to the last special (reserved) token

    @classmethod
    def from_encoding(cls, enc: HarmonyEncoding) -> "HarmonyTokens":
        def one(text: str) -> int:
            (tid,) = enc.encode(text, allowed_special="all")
            return tid

        vocab_size = 1 + max(one(s) for s in enc.special_tokens_set)
        return cls(one("<|start|>"), one("<|end|>"), one("<|message|>"), one("<|channel|>"),
                   one("<|constrain|>"), one("<|return|>"), one("<|call|>"), one("<|endoftext|>"), vocab_size)
