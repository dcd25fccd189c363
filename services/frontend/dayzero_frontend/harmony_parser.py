"""Turn one choice's generated token ids into OpenAI deltas, whatever the model emits.

Parsing is done by openai-harmony's ``StreamableParser`` (one per choice). It handles well-formed
messages but raises on, or silently mangles, structural mistakes a model can make (a missing
``<|end|>``, a ``<|start|>`` inside a header, text outside any message, tokens after ``<|call|>``,
an unparseable header). :class:`ChoiceParser` watches the structural special tokens itself, keeps
the harmony parser fed with a well-formed stream (inserting the missing delimiter, dropping a stray
one, or restarting from a clean header rebuilt from what the model wrote), and records each repair
in ``anomalies`` so the frontend can count them. It never raises.

Mapping (message -> delta): assistant messages only; a recipient ``functions.NAME`` on any channel
-> a tool call; another recipient (a built-in tool we do not offer) or channel ``analysis`` ->
reasoning; ``final``, ``commentary`` (preambles), no channel, or an unknown channel -> content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from enum import Enum

from openai_harmony import HarmonyEncoding, Role, StreamableParser

from dayzero_frontend.harmony_events import (ContentDelta, Event, HarmonyTokens, ReasoningDelta, ToolCall,
                                              ToolCallBegin, ToolCallDelta)

MAX_HEADER_TOKENS = 64  # a "header" longer than this is plain text the model wrote without one
_CHANNEL_RE = re.compile(r"[A-Za-z0-9_\-]+")
_RECIPIENT_RE = re.compile(r"to=([^\s<]+)")


class _State(Enum):
    EXPECT_START = 0
    HEADER = 1
    CONTENT = 2


@dataclass
class ChoiceParser:
    """Incremental parser of one choice. Feed tokens with :meth:`feed`; call :meth:`finish` once."""

    enc: HarmonyEncoding
    ids: HarmonyTokens
    tool_names: frozenset[str] = frozenset()
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_tokens: int = 0
    done: bool = False  # a stop token (<|return|>, <|call|>, <|endoftext|>) was seen
    anomalies: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # The prompt ends with `<|start|>assistant`, so the output begins inside a header.
        self._parser = StreamableParser(self.enc, Role.ASSISTANT)
        self._state = _State.HEADER
        self._header: list[int] = []
        self._kind = "drop"  # of the open message: reasoning | content | tool | drop
        self._assistant_ids = self.enc.encode("assistant", disallowed_special=())

    # ---- public -----------------------------------------------------------------------------
    def feed(self, token: int) -> list[Event]:
        """Process one generated token; returns the deltas it produced."""
        if self.done:
            self._note("tokens_after_stop")
            return []
        if not 0 <= token < self.ids.vocab_size:
            self._note("token_out_of_vocab")
            return []
        out: list[Event] = []
        try:
            self._dispatch(token, out)
        except Exception as e:  # noqa: BLE001 - a case the repairs did not foresee: restart cleanly
            self._note("parser_error:" + type(e).__name__)
            self._reset()
        return out

    def finish(self) -> list[Event]:
        """The stream ended (stop, length or abort): flush what can be flushed."""
        out: list[Event] = []
        try:
            if self._state is _State.CONTENT:
                self._close_message(out, eos=True)
            elif self._state is _State.HEADER and self._header:
                self._note("incomplete_header")
        except Exception as e:  # noqa: BLE001 - what was parsed is already in `out`
            self._note("parser_error:" + type(e).__name__)
        self._state = _State.EXPECT_START
        return out

    # ---- token dispatch ---------------------------------------------------------------------
    def _dispatch(self, tok: int, out: list[Event]) -> None:
        ids = self.ids
        if tok in (ids.return_, ids.call, ids.endoftext):
            if self._state is _State.CONTENT:
                if tok == ids.endoftext:
                    self._close_message(out, eos=True)
                else:
                    self._feed(tok, out)
                    self._close_message(out)
            elif self._state is _State.HEADER and self._header:
                self._note("header_without_message")
            self.done = True
            self._state = _State.EXPECT_START
            return
        if self._state is _State.CONTENT:
            self._in_content(tok, out)
        elif self._state is _State.HEADER:
            self._in_header(tok, out)
        else:
            self._expect_start(tok, out)

    def _in_content(self, tok: int, out: list[Event]) -> None:
        ids = self.ids
        if tok == ids.end:
            self._feed(tok, out)
            self._close_message(out)
            self._state = _State.EXPECT_START
        elif tok in (ids.start, ids.channel):  # a new message without closing this one
            self._note("missing_end")
            self._feed(ids.end, out)
            self._close_message(out)
            self._state = _State.EXPECT_START
            self._expect_start(tok, out)
        elif self.enc.is_special_token(tok):  # <|message|>, <|constrain|>, reserved ids
            self._note("stray_special_in_content")
        else:
            self._feed(tok, out)

    def _in_header(self, tok: int, out: list[Event]) -> None:
        ids = self.ids
        if tok == ids.start:
            if self._header:
                self._note("restarted_header")
            self._reset()
            self._begin_header()
        elif tok == ids.end:
            self._note("header_without_message")
            self._reset()
        elif tok == ids.message:
            self._open_message(out)
        elif tok in (ids.channel, ids.constrain) or not self.enc.is_special_token(tok):
            self._header.append(tok)
            if len(self._header) > MAX_HEADER_TOKENS:
                self._header_was_text(out)
            else:
                self._parser.process(tok)
        else:
            self._note("stray_special_in_header")

    def _expect_start(self, tok: int, out: list[Event]) -> None:
        ids = self.ids
        if tok == ids.start:
            self._begin_header()
        elif tok == ids.channel or not self.enc.is_special_token(tok):
            self._note("missing_start")  # `<|channel|>` or text right after `<|end|>`
            self._begin_header()
            if tok == ids.channel:
                for t in self._assistant_ids:
                    self._parser.process(t)
            self._in_header(tok, out)
        else:
            self._note("stray_special_between_messages")

    # ---- messages ---------------------------------------------------------------------------
    def _begin_header(self) -> None:
        self._parser.process(self.ids.start)
        self._state = _State.HEADER
        self._header = []

    def _open_message(self, out: list[Event]) -> None:
        try:
            self._parser.process(self.ids.message)
            role, recipient = self._parser.current_role, self._parser.current_recipient
            sane = recipient is None or "<|" not in recipient
        except Exception:  # noqa: BLE001 - harmony errors and unknown roles alike
            role, recipient, sane = None, None, False
        if not sane:
            self._note("bad_header")
            self._rebuild_header()
            role, recipient = self._parser.current_role, self._parser.current_recipient
        self._state = _State.CONTENT
        self._classify(role, recipient, self._parser.current_channel, out)

    def _rebuild_header(self) -> None:
        """Restart from a canonical header holding the channel and recipient the model wrote."""
        text = self.enc.decode(self._header)
        channel = None
        if self.ids.channel in self._header:
            after = self._header[len(self._header) - self._header[::-1].index(self.ids.channel):]
            m = _CHANNEL_RE.match(self.enc.decode(after).strip())
            channel = m.group(0) if m else None
        m = _RECIPIENT_RE.search(text)
        header = "<|start|>assistant" + (f" to={m.group(1)}" if m else "")
        header += (f"<|channel|>{channel}" if channel else "") + "<|message|>"
        self._parser = StreamableParser(self.enc, None)
        for t in self.enc.encode(header, allowed_special="all"):
            self._parser.process(t)

    def _header_was_text(self, out: list[Event]) -> None:
        """Many tokens and no `<|message|>`: the model wrote plain text; show it as content."""
        self._note("text_without_header")
        pending, self._header = self._header, []
        self._rebuild_header()
        self._state = _State.CONTENT
        self._classify(self._parser.current_role, None, None, out)
        for t in pending:
            self._dispatch(t, out)

    def _classify(self, role: Role | None, recipient: str | None, channel: str | None,
                  out: list[Event]) -> None:
        self._channel = channel
        if role is not Role.ASSISTANT:
            self._note("non_assistant_message")
            self._kind = "drop"
        elif recipient and recipient.startswith("functions.") and len(recipient) > len("functions."):
            self._kind = "tool"
            name = self._tool_name(recipient[len("functions."):])
            call = ToolCall(call_id="call_" + secrets.token_hex(12), name=name)
            self.tool_calls.append(call)
            out.append(ToolCallBegin(len(self.tool_calls) - 1, call.call_id, call.name))
        elif recipient and recipient not in ("assistant", "all", "user"):
            self._note("unknown_recipient")
            self._kind = "reasoning"
        elif channel == "analysis":
            self._kind = "reasoning"
        else:
            if channel not in ("final", "commentary"):
                self._note("unknown_channel" if channel else "missing_channel")
            self._kind = "content"

    def _tool_name(self, name: str) -> str:
        if not self.tool_names or name in self.tool_names:
            return name
        matches = [t for t in self.tool_names if t.replace("-", "_") == name.replace("-", "_")]
        if len(matches) == 1:
            self._note("tool_name_normalized")
            return matches[0]
        self._note("undeclared_tool")
        return name

    def _feed(self, tok: int, out: list[Event]) -> None:
        self._parser.process(tok)
        if self._state is not _State.CONTENT:
            return
        if self._kind == "reasoning" and tok not in (self.ids.end, self.ids.return_, self.ids.call):
            self.reasoning_tokens += 1
        delta = self._parser.last_content_delta
        if delta:
            self._emit(delta, out)

    def _emit(self, delta: str, out: list[Event]) -> None:
        if self._kind == "reasoning":
            self.reasoning += delta
            out.append(ReasoningDelta(delta))
        elif self._kind == "content":
            self.content += delta
            out.append(ContentDelta(delta))
        elif self._kind == "tool":
            self.tool_calls[-1].arguments += delta
            out.append(ToolCallDelta(len(self.tool_calls) - 1, delta))

    def _close_message(self, out: list[Event], eos: bool = False) -> None:
        if eos:
            self._parser.process_eos()
        if self._kind == "tool":
            try:
                json.loads(self.tool_calls[-1].arguments)
            except ValueError:
                self._note("invalid_tool_arguments")
        self._kind = "drop"

    def _reset(self) -> None:
        self._parser = StreamableParser(self.enc, None)
        self._state = _State.EXPECT_START
        self._header = []
        self._kind = "drop"

    def _note(self, kind: str) -> None:
        self.anomalies.append(kind)
