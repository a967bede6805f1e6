"""Incremental detokenization: token ids in, finished text deltas out.

Decoding one token at a time is wrong twice over: a byte-level BPE token can hold part of a
multi-byte UTF-8 character (it decodes to U+FFFD alone), and SentencePiece-style tokenizers
drop or add a leading space depending on what comes before. So, like vLLM and TGI, we keep
two offsets into the token list: text is decoded over a short window that starts at
`prefix_offset` (tokens whose text was already emitted, giving context) and the delta is
what decoding `tokens[prefix_offset:]` adds beyond decoding `tokens[prefix_offset:read_offset]`.
Each step costs O(window), never O(sequence length). The window is decoded by the Rust tokenizer
directly (Tokenizer.decode with cleanup of tokenization spaces off, which would rewrite text already sent).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from gateway.hf_tokenizer import Tokenizer

# How many prompt tokens give the first generated token its context (vLLM uses 5 too).
_PROMPT_CONTEXT_TOKENS = 5
# A UTF-8 character is at most 4 bytes, and every token carries at least one byte, so a
# window that still ends in U+FFFD after this many pending tokens holds invalid bytes that
# no later token can repair: emit it as is rather than let the window grow without bound.
_MAX_PENDING_TOKENS = 8
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas for one sequence.

    `prompt_ids` only provide context for the first generated tokens (their text is never
    returned). Concatenating every `add()` result and the final `flush()` gives the same text
    as decoding all generated tokens at once, except that text is never returned while it
    ends in an incomplete UTF-8 character.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Iterable[int] = (),
        *,
        skip_special_tokens: bool = True,
    ) -> None:
        self._backend_decode = tokenizer.backend.decode
        self._skip_special = skip_special_tokens
        # Only the tail of the prompt is ever decoded again, so keep only the tail.
        self._ids: list[int] = list(prompt_ids)[-_PROMPT_CONTEXT_TOKENS:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    @property
    def pending_tokens(self) -> int:
        """Tokens received but not yet turned into text (waiting for a complete character)."""
        return len(self._ids) - self._read_offset

    def add(self, token_ids: Iterable[int]) -> str:
        """Feed newly generated token ids; return the text they finish (possibly "")."""
        out: list[str] = []
        for token_id in token_ids:
            self._ids.append(int(token_id))
            out.append(self._step(force=False))
        return "".join(out)

    def flush(self) -> str:
        """At the end of the sequence: return whatever is still held back, even if incomplete."""
        if self._read_offset == len(self._ids):
            return ""
        return self._step(force=True)

    def _decode(self, ids: list[int]) -> str:
        # Cleanup of tokenization spaces rewrites text around punctuation after the fact,
        # which would change text already sent; it stays off for streaming (the Rust decode is without it).
        return self._backend_decode(ids, skip_special_tokens=self._skip_special)

    def _step(self, *, force: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        pending = len(self._ids) - self._read_offset
        if new_text.endswith(_REPLACEMENT) and not force and pending < _MAX_PENDING_TOKENS:
            return ""  # the last character is not complete yet
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._compact()
        return delta

    def _compact(self) -> None:
        # Tokens before prefix_offset are never decoded again; drop them so memory stays O(window).
        if self._prefix_offset > 64:
            drop = self._prefix_offset
            del self._ids[:drop]
            self._prefix_offset -= drop
            self._read_offset -= drop


class ByteTable:
    """Each token id's UTF-8 bytes, for tokenizers whose decoder is plain ByteLevel (GPT-2 style:
    SmolLM2, Llama 3, Qwen2). Their decode of a token list is the lossy UTF-8 decoding of the
    concatenated bytes of its tokens, so text can be streamed byte-wise, one table lookup per token,
    instead of decoding a window twice per token. `build` returns None for any other decoder."""

    def __init__(self, pieces: list[bytes], special: frozenset[int]) -> None:
        self.pieces = pieces
        self.special = special

    @staticmethod
    def build(tokenizer: Tokenizer) -> "ByteTable | None":
        if type(tokenizer.backend.decoder).__name__ != "ByteLevel":
            return None
        byte_of = {c: b for b, c in _byte_level_chars().items()}
        pieces = []
        for token_id in range(len(tokenizer)):
            token = tokenizer.id_to_token(token_id) or ""
            # As the Rust ByteLevel decoder: mapped byte-wise when every char maps, else its own UTF-8.
            mapped = [byte_of.get(c) for c in token]
            pieces.append(token.encode() if None in mapped else bytes(mapped))  # type: ignore[arg-type]
        return ByteTable(pieces, tokenizer.added_special_ids)


class ByteLevelDetokenizer:
    """IncrementalDetokenizer's interface over a ByteTable: same text, O(1) per token. An incomplete
    UTF-8 character at the end is held back (at most 3 bytes); invalid bytes become U+FFFD as in
    a full decode. No prompt context is needed: byte-level tokens carry their own spaces."""

    def __init__(self, table: ByteTable, *, skip_special_tokens: bool = True) -> None:
        self._pieces = table.pieces
        self._skip = table.special if skip_special_tokens else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = 0

    @property
    def pending_tokens(self) -> int:
        """Tokens whose bytes are (partly) held back, waiting for the rest of a character."""
        return self._pending

    def add(self, token_ids: Iterable[int]) -> str:
        """Feed newly generated token ids; return the text they finish (possibly "")."""
        skip, pieces = self._skip, self._pieces
        ids = list(token_ids)
        data = b"".join([pieces[t] for t in ids if t not in skip])
        if not data:
            return ""
        text = self._utf8.decode(data)
        self._pending = self._pending + len(ids) if self._utf8.getstate()[0] else 0
        return text

    def flush(self) -> str:
        """At the end of the sequence: whatever bytes are still held, as U+FFFD."""
        self._pending = 0
        return self._utf8.decode(b"", final=True)


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the one the ByteLevel pre-tokenizer and decoder use)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


def make_detokenizer(tokenizer: Tokenizer, prompt_ids: Iterable[int], table: ByteTable | None,
                     skip_special_tokens: bool = True) -> IncrementalDetokenizer | ByteLevelDetokenizer:
    """The byte-wise detokenizer when the tokenizer has a ByteTable, else the windowed one."""
    if table is not None:
        return ByteLevelDetokenizer(table, skip_special_tokens=skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=skip_special_tokens)
