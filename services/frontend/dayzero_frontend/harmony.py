"""OpenAI chat requests -> Harmony prompt token ids, strictly through openai-harmony.

Mapping: a system message carrying ``reasoning_effort`` and today's date; every client ``system`` or
``developer`` message -> the developer instructions; ``tools`` -> developer function tools;
assistant history: ``reasoning``/``reasoning_content`` -> ``analysis``, ``content`` -> ``final``
(or a ``commentary`` preamble when the message also calls tools), ``tool_calls`` -> ``commentary``
messages to ``functions.NAME``; ``tool`` messages -> author ``functions.NAME`` (the name found
through ``tool_call_id``). Analysis from turns that already ended in a final answer is dropped, as
Harmony requires. User text is encoded as ordinary text: ``<|start|>`` typed by a user is not a
special token.
"""

from __future__ import annotations

import datetime as dt

from openai_harmony import (Author, Conversation, DeveloperContent, HarmonyEncoding, HarmonyError, Message,
                            ReasoningEffort, Role, SystemContent, ToolDescription)

from dayzero_frontend.errors import bad_request
from dayzero_frontend.harmony_events import HarmonyTokens
from dayzero_frontend.harmony_parser import ChoiceParser
from dayzero_frontend.openai_protocol import ChatCompletionRequest, FunctionDef
from dayzero_frontend.validation import content_text

EFFORTS = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}
ROLES = ("system", "developer", "user", "assistant", "tool")


class HarmonyChat:
    """The Harmony encoding plus everything the frontend derives from it."""

    def __init__(self, enc: HarmonyEncoding):
        self.enc = enc
        self.ids = HarmonyTokens.from_encoding(enc)
        # Chat stops only where the assistant hands over: <|return|> (answer) or <|call|> (tool).
        self.chat_stop_ids = sorted(enc.stop_tokens_for_assistant_actions())
        # Raw completions stop where the model's generation config does (plus <|endoftext|>).
        self.completion_stop_ids = sorted({*self.chat_stop_ids, self.ids.endoftext})
        self.vocab_size = self.ids.vocab_size

    def new_parser(self, tool_names: frozenset[str]) -> ChoiceParser:
        return ChoiceParser(self.enc, self.ids, tool_names)

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids; ids outside the vocabulary (a broken model) decode to nothing."""
        return self.enc.decode([t for t in ids if 0 <= t < self.vocab_size])

    def encode_prompt_text(self, text: str) -> list[int]:
        """A raw completion prompt: special-token text is taken as written (no chat format)."""
        return self.enc.encode(text, allowed_special="all")

    def tool_call_header(self, name: str) -> list[int]:
        """The tokens that continue a prompt ending in ``<|start|>assistant`` into a call of
        ``functions.NAME`` with JSON arguments, up to and including ``<|message|>`` (rendered by
        openai-harmony from such a message, so the format is the library's)."""
        msg = (Message.from_role_and_content(Role.ASSISTANT, "{}").with_channel("commentary")
               .with_recipient(f"functions.{name}").with_content_type("<|constrain|>json"))
        toks = self.enc.render(msg)
        role = [self.ids.start, *self.enc.encode("assistant", disallowed_special=())]
        if toks[:len(role)] != role or self.ids.message not in toks:
            raise RuntimeError(f"unexpected Harmony rendering of a tool call: {self.enc.decode(toks)!r}")
        return toks[len(role):toks.index(self.ids.message) + 1]

    def final_header(self) -> list[int]:
        """The tokens that continue a prompt ending in ``<|start|>assistant`` straight into the final
        answer, up to and including ``<|message|>`` (structured output skips the analysis channel)."""
        toks = self.enc.render(Message.from_role_and_content(Role.ASSISTANT, "x").with_channel("final"))
        role = [self.ids.start, *self.enc.encode("assistant", disallowed_special=())]
        if toks[:len(role)] != role or self.ids.message not in toks:
            raise RuntimeError(f"unexpected Harmony rendering of a final message: {self.enc.decode(toks)!r}")
        return toks[len(role):toks.index(self.ids.message) + 1]

    def render_chat(self, req: ChatCompletionRequest, tools: list[FunctionDef], today: dt.date) -> list[int]:
        messages = self.chat_messages(req, tools, today)
        try:
            return self.enc.render_conversation_for_completion(Conversation.from_messages(messages), Role.ASSISTANT)
        except HarmonyError as e:
            raise bad_request(f"the conversation cannot be rendered in Harmony: {e}", param="messages") from e

    def chat_messages(self, req: ChatCompletionRequest, tools: list[FunctionDef], today: dt.date) -> list[Message]:
        if not req.messages:
            raise bad_request("messages must contain at least one message", param="messages")
        effort = "medium" if req.reasoning_effort is None else req.reasoning_effort
        if effort not in EFFORTS:
            raise bad_request(f"reasoning_effort must be one of low, medium, high; got {req.reasoning_effort!r}",
                              param="reasoning_effort")
        system = SystemContent.new().with_reasoning_effort(EFFORTS[effort])
        system = system.with_conversation_start_date(today.isoformat())
        instructions: list[str] = []
        turns: list[Message] = []
        call_names: dict[str, str] = {}
        for i, msg in enumerate(req.messages):
            where = f"messages[{i}]"
            if msg.role not in ROLES:
                raise bad_request(f"{where}.role {msg.role!r} is not supported; use one of {', '.join(ROLES)}",
                                  param=f"{where}.role")
            if msg.role in ("system", "developer"):
                instructions.append(content_text(msg.content, where, allow_null=False))
            elif msg.role == "user":
                turns.append(Message.from_role_and_content(Role.USER, content_text(msg.content, where, False)))
            elif msg.role == "assistant":
                turns.extend(self._assistant(msg, where, call_names))
            else:
                turns.append(self._tool_result(msg, where, call_names))
        head = [Message.from_role_and_content(Role.SYSTEM, system)]
        if instructions or tools:
            developer = DeveloperContent.new()
            if instructions:
                developer = developer.with_instructions("\n\n".join(instructions))
            if tools:
                developer = developer.with_function_tools(
                    [ToolDescription.new(t.name, t.description or "", t.parameters) for t in tools])
            head.append(Message.from_role_and_content(Role.DEVELOPER, developer))
        return head + drop_finished_analysis(turns)

    @staticmethod
    def _assistant(msg, where: str, call_names: dict[str, str]) -> list[Message]:
        out = []
        reasoning = msg.reasoning if msg.reasoning is not None else msg.reasoning_content
        if reasoning:
            out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
        text = content_text(msg.content, where, allow_null=True)
        calls = msg.tool_calls or []
        if text or not (calls or reasoning):
            channel = "commentary" if calls else "final"
            out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel))
        for j, call in enumerate(calls):
            if call.type != "function":
                raise bad_request(f"{where}.tool_calls[{j}].type must be 'function'", param=f"{where}.tool_calls")
            call_names[call.id] = call.function.name
            out.append(Message.from_role_and_content(Role.ASSISTANT, call.function.arguments)
                       .with_channel("commentary").with_recipient(f"functions.{call.function.name}")
                       .with_content_type("<|constrain|>json"))
        return out

    @staticmethod
    def _tool_result(msg, where: str, call_names: dict[str, str]) -> Message:
        if not msg.tool_call_id:
            raise bad_request(f"{where}: a tool message needs tool_call_id", param=f"{where}.tool_call_id")
        name = call_names.get(msg.tool_call_id)
        if name is None:
            raise bad_request(f"{where}.tool_call_id {msg.tool_call_id!r} does not match any earlier assistant"
                              " tool call", param=f"{where}.tool_call_id")
        author = Author.new(Role.TOOL, f"functions.{name}")
        return (Message.from_author_and_content(author, content_text(msg.content, where, allow_null=False))
                .with_channel("commentary").with_recipient("assistant"))


def drop_finished_analysis(turns: list[Message]) -> list[Message]:
    """Drop assistant analysis that precedes the last final answer (earlier, finished turns)."""
    last_final = max((i for i, m in enumerate(turns) if m.author.role == Role.ASSISTANT and m.channel == "final"),
                     default=-1)
    return [m for i, m in enumerate(turns)
            if not (i < last_final and m.author.role == Role.ASSISTANT and m.channel == "analysis")]
