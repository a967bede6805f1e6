"""Stop strings applied to a stream of text deltas (OpenAI semantics: the stop is not sent)."""

from __future__ import annotations


class StopChecker:
    """Finds stop strings in streamed text without ever sending text that a stop may cover.

    Feed each text delta to `feed()`; it returns `(text_to_emit, matched_stop)`. Text that
    could still be the beginning of a stop string is held back until it either becomes a stop
    (then it and everything after it are dropped) or cannot (then it is emitted). If several
    stops match, the one that completes first in the text wins; among stops completing at the
    same character, the one starting earliest (so the least text is emitted). The result does
    not depend on how the text was split into deltas. Call `flush()` at the end of the stream
    to get the held-back text. After a match every later call returns ("", None).
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        if any(s == "" for s in stop):
            raise ValueError("stop strings must not be empty")
        self._stops = tuple(dict.fromkeys(stop))
        self._max_hold = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the text, once one has."""
        return self._matched

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Add a text delta; return the text now safe to emit and the stop matched by it."""
        if self._matched is not None:
            return "", None
        if not self._stops:
            return delta, None
        text = self._held + delta
        hit = self._earliest_match(text)
        if hit is not None:
            start, stop = hit
            self._held = ""
            self._matched = stop
            return text[:start], stop
        hold = self._holdback(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], None

    def flush(self) -> str:
        """End of stream without a match: return the text held back (never a whole stop)."""
        held, self._held = self._held, ""
        return "" if self._matched is not None else held

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), start, stop)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else (best[1], best[2])

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop."""
        for n in range(min(len(text), self._max_hold), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0


def tag_start(text: str, tag: str) -> int:
    """The length of the longest end of text that begins tag (0 if none): what a stream holds
    back while it waits to see whether the tag comes."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
