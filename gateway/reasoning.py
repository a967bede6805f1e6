"""Reasoning on the OpenAI face: a thinking model's `<think>...</think>` apart from its answer.

With `pdserve gateway --reasoning-parser P`, a chat answer's text up to `</think>` goes out as
`reasoning` (and `reasoning_content`, its older name in vLLM) and the rest as `content`; tool
calls are read from the content only. Where the answer starts:

- inside the reasoning when the prompt ends with `<think>` (templates that open the thinking
  for the model: DeepSeek-R1 distills, Qwen3 thinking models) or, for `deepseek_r1`, always
  (R1 may leave out the opening tag): an answer with no `</think>` is then all reasoning;
- else (`qwen3`) as content, unless the answer itself opens with `<think>`: Qwen3 with
  `enable_thinking: false` writes no tags and its text is content.

A constrained output (structured output, a forced tool call) is constrained after the reasoning
(the OpenAI face sets StructuredOutput.reasoning: "open" where the answer starts inside it, else
"optional", or nothing where the prompt closed the reasoning itself; pdserve.guided puts any text
up to "</think>" before the language). A model that does not think should not be served with a
reasoning parser: "optional" lets it open a "<think>" it may never close.
`include_reasoning: false` drops the reasoning from the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.stops import tag_start

PARSERS = ("deepseek_r1", "qwen3")
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Reasoning:
    """How one request's answer is split: `opened` (it starts inside the reasoning), whether the
    reasoning is sent (`include`), and where a constrained output starts (`guided`: "open",
    "optional" or "" for StructuredOutput.reasoning)."""

    opened: bool
    include: bool = True
    guided: str = "optional"


def for_request(parser: str | None, prompt_tail: str, include: bool) -> Reasoning | None:
    """The split for a request (None: no parser, the text is all content). `prompt_tail`: the end
    of the prompt's text, special tokens included. A prompt that closed the reasoning itself (Qwen3's
    template with enable_thinking false ends with "<think>\n\n</think>\n\n") leaves none to the answer."""
    if parser is None:
        return None
    tail = prompt_tail.rstrip()
    if tail.endswith(CLOSE):
        return Reasoning(False, include, "")
    opened = parser == "deepseek_r1" or tail.endswith(OPEN)
    return Reasoning(opened, include, "open" if opened else "optional")


def split(reasoning: Reasoning, text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning None where there was none (or it is
    not to be sent)."""
    stream = ReasoningStream(reasoning)
    parts = [*stream.feed(text), *stream.close()]
    thought = "".join(p.get("reasoning", "") for p in parts)
    content = "".join(p.get("content", "") for p in parts)
    return (thought if stream.thought and reasoning.include else None), content


class ReasoningStream:
    """One choice's streamed text in, deltas out: {"reasoning": ...} while it thinks, then
    {"content": ...}. Text that may be the start of a tag it waits for is held back; the newlines
    a model writes after `</think>` are not sent."""

    def __init__(self, reasoning: Reasoning) -> None:
        self.reasoning = reasoning
        self.state = "start"  # start -> thinking -> answer; or start -> answer
        self.held = ""
        self.thought = False  # some reasoning was read (sent or not)
        self.trim = False  # the newlines after </think> are still to be dropped

    def feed(self, text: str) -> list[dict]:
        self.held += text
        out: list[dict] = []
        if self.state == "start":
            stripped = self.held.lstrip()
            if OPEN.startswith(stripped):  # maybe the opening tag, not all here yet
                return out
            if stripped.startswith(OPEN):
                self.state, self.held = "thinking", stripped[len(OPEN):]
            else:
                self.state = "thinking" if self.reasoning.opened else "answer"
        if self.state == "thinking":
            at = self.held.find(CLOSE)
            cut = at if at >= 0 else len(self.held) - tag_start(self.held, CLOSE)
            out += self._thought(self.held[:cut])
            if at < 0:
                self.held = self.held[cut:]
                return out
            self.state, self.held, self.trim = "answer", self.held[at + len(CLOSE):], True
        if self.state == "answer":
            if self.trim:  # they may come in later chunks
                self.held = self.held.lstrip("\n")
                self.trim = not self.held
            if self.held:
                out.append({"content": self.held})
                self.held = ""
        return out

    def close(self) -> list[dict]:
        """At the end: what was held back, as what it was part of."""
        held, self.held = self.held, ""
        if self.state == "start":
            self.state = "thinking" if self.reasoning.opened else "answer"
        if not held:
            return []
        return self._thought(held) if self.state == "thinking" else [{"content": held}]

    def _thought(self, text: str) -> list[dict]:
        if not text:
            return []
        self.thought = True
        return [{"reasoning": text}] if self.reasoning.include else []
