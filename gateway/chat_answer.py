"""A chat answer's text as OpenAI shapes it: the reasoning apart (gateway.reasoning), tool calls
read out of what follows it (gateway.tools), the rest as content. `message` for a whole answer,
`ChatDeltas` for a streamed one; both give the same message for the same text."""

from __future__ import annotations

from gateway import reasoning as think
from gateway import tools


def _reasoning(text: str) -> dict:
    """The reasoning fields: `reasoning` (vLLM's name now) and `reasoning_content` (its older
    one, which clients still read)."""
    return {"reasoning": text, "reasoning_content": text}


def message(text: str, finish: str | None, reasoning: think.Reasoning | None,
            tool_choice: tools.ToolChoice | None) -> tuple[dict, str | None]:
    """A whole answer's chat message and finish reason."""
    thought = None
    if reasoning is not None:
        thought, text = think.split(reasoning, text)
    msg: dict = {"role": "assistant", "content": text}
    if tool_choice is not None:
        msg, finish = tools.message(tool_choice, text, finish)
    if thought is not None:
        msg.update(_reasoning(thought))
        if msg["content"] == "":
            msg["content"] = None
    return msg, finish


class ChatDeltas:
    """One streamed chat choice: `feed` each chunk's text and send the deltas it returns; `close`
    gives the last ones and the finish reason."""

    def __init__(self, reasoning: think.Reasoning | None, tool_choice: tools.ToolChoice | None) -> None:
        self.thinking = think.ReasoningStream(reasoning) if reasoning is not None else None
        self.calls = tools.ToolStream(tool_choice) if tool_choice is not None else None

    def feed(self, text: str) -> list[dict]:
        parts = self.thinking.feed(text) if self.thinking is not None else [{"content": text}]
        return self._shape(parts)

    def close(self, finish: str | None) -> tuple[list[dict], str | None]:
        out = self._shape(self.thinking.close()) if self.thinking is not None else []
        if self.calls is not None:
            last, finish = self.calls.close(finish)
            out += last
        return out, finish

    def _shape(self, parts: list[dict]) -> list[dict]:
        out: list[dict] = []
        for part in parts:
            if "reasoning" in part:
                out.append(_reasoning(part["reasoning"]))
            elif self.calls is not None:
                out += self.calls.feed(part["content"])
            elif part["content"]:
                out.append(part)
        return out
