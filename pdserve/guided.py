"""Structured output: a Guide (core.sampling) -> an llguidance grammar -> each step's token mask.

The gateway compiles a request's guide once to refuse a bad schema, regex or grammar before it
is dispatched (naming the field); each worker compiles it again to follow it: the prefill
worker masks the first token, the decode worker replays that token into a fresh matcher and
masks every later one. Compiled matchers are kept per guide (LRU) and copied per request.

JSON is generated compact and in one form, `{"a": 1, "b": [2, 3]}` (json.dumps' separators, no
other whitespace): with free whitespace a small model can spend its whole budget on newlines.
A schema's own `x-guidance` options (llguidance's) win over these: the OpenAI face's
guided_whitespace_pattern sets whitespace_pattern and bare separators there.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from pdserve.core.request import TokenGuide
from pdserve.core.sampling import Guide, GuideKind, SamplingParams, ValidationError

log = logging.getLogger(__name__)

JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
CACHED_GUIDES = 128  # compiled matchers kept per compiler (a new request copies one)


# The reasoning before a guide's language (Guide.reasoning): any text up to the first "</think>"
# (a lazy lexeme: it ends at the first match), then whitespace, then the language (@answer).
THINKING = 'think[lazy]: /(?s:.*)<\\/think>/\nWS: /[ \\t\\n]*/\n'
REASONING_STARTS = {"open": "start: think WS @answer\n", "optional": 'start: ("<think>" think WS)? @answer\n'}


def grammar(guide: Guide) -> str:
    """The llguidance grammar of a guide that passed Guide.validate (not yet compiled); with
    guide.reasoning, the reasoning first and the guide's own grammar after it (as "answer")."""
    language = _language(guide)
    if not guide.reasoning:
        return language
    top = json.loads(language) if language.startswith("{") else {"grammars": [{"lark_grammar": language}]}
    answer = {**top["grammars"][0], "name": "answer"}
    start = {"lark_grammar": REASONING_STARTS[guide.reasoning] + THINKING}
    return json.dumps({**top, "grammars": [start, answer, *top["grammars"][1:]]})


def _language(guide: Guide) -> str:
    if guide.kind is GuideKind.JSON:  # options the schema's own x-guidance sets are its own
        schema = json.loads(guide.value)
        given = schema.get("x-guidance") if isinstance(schema, dict) else None
        overrides = {k: v for k, v in JSON_OPTIONS.items() if not isinstance(given, dict) or k not in given}
        return llguidance.LLMatcher.grammar_from_json_schema(guide.value, overrides=overrides)
    if guide.kind is GuideKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(guide.value)
    if guide.kind is GuideKind.CHOICE:  # JSON string literals are Lark's too
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c) for c in json.loads(guide.value)))
    return llguidance.LLMatcher.grammar_from_lark(guide.value)


class LLGuide:
    """A request's grammar state (core.request.TokenGuide) over an llguidance matcher."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def allowed(self) -> bytes:
        return self._matcher.compute_bitmask()

    def accept(self, token: int) -> bool:
        return self._matcher.consume_token(token)


class GuideCompiler:
    """Compiles guides against one tokenizer (thread-safe) and computes a step's masks.

    The tokenizer is read on first use (~0.3-1 s of CPU in llguidance), not at start: a
    deployment that never asks for structured output never pays for it."""

    def __init__(self, tokenizer_json: str | Path, eos_ids: Sequence[int]) -> None:
        self._path, self._eos = Path(tokenizer_json), list(eos_ids) or None  # None: llguidance's guess
        self._tok: llguidance.LLTokenizer | None = None
        self._broken: str | None = None  # why llguidance could not read the tokenizer
        self._executor: llguidance.LLExecutor | None = None  # a thread pool: one step's masks at once
        self._compiled: OrderedDict[Guide, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model_dir: str | Path | None, eos_ids: Sequence[int]) -> GuideCompiler | None:
        """The compiler of a model folder's tokenizer.json; None when it has none."""
        path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
        return cls(path, eos_ids) if path is not None and path.is_file() else None

    @property
    def _tokenizer(self) -> llguidance.LLTokenizer:
        """The tokenizer, read once; ValidationError naming `guide` if llguidance cannot read it
        (structured output is then refused, everything else served)."""
        with self._lock:
            if self._tok is None and self._broken is None:
                try:
                    self._tok = llguidance.LLTokenizer(str(self._path), eos_token=self._eos)
                    self._executor = llguidance.LLExecutor()
                except (ValueError, RuntimeError) as e:
                    self._broken = str(e)
                    log.warning("structured output is off: llguidance cannot read %s (%s)", self._path, e)
        if self._tok is None:
            raise ValidationError("guide", f"structured output is off here: llguidance cannot read the model's "
                                  f"tokenizer.json ({self._broken})")
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    def masks(self, guides: list[TokenGuide]) -> list[bytes]:
        """TokenGuide.allowed of each guide, the LLGuides' computed in parallel (Scheduler's
        guide_masks): a mask costs ~10-300 us (more while a JSON string is open), per guide."""
        ours = [i for i, g in enumerate(guides) if isinstance(g, LLGuide)]
        out = [b"" if isinstance(g, LLGuide) else g.allowed() for g in guides]
        if len(ours) == 1:
            out[ours[0]] = guides[ours[0]].allowed()
        elif ours:
            words = np.empty(((len(ours)), (self.vocab_size + 31) // 32), dtype=np.int32)
            fill_next_token_bitmask_par(self._executor, [(guides[i]._matcher, r) for r, i in enumerate(ours)], words)
            for r, i in enumerate(ours):
                out[i] = words[r].tobytes()  # little-endian words: bit t % 8 of byte t // 8
        return out

    def check(self, guide: Guide) -> None:
        """Raise ValidationError("guide", why) if the guide does not compile."""
        self._template(guide)

    def new(self, guide: Guide, generated: Iterable[int] = ()) -> LLGuide:
        """A fresh guide state that has accepted `generated` (ValidationError if one breaks it)."""
        matcher = self._template(guide).deep_copy()
        for t in generated:
            if not matcher.consume_token(t):
                raise ValidationError("guide", f"token {t} already generated leaves the language: "
                                      f"{matcher.get_error()}")
        return LLGuide(matcher)

    def _template(self, guide: Guide) -> llguidance.LLMatcher:
        with self._lock:
            m = self._compiled.get(guide)
            if m is not None:
                self._compiled.move_to_end(guide)
                return m
        guide.validate()
        try:
            text = grammar(guide)
        except ValueError as e:
            raise ValidationError("guide", f"the {guide.kind.value} does not compile: {e}") from None
        m = llguidance.LLMatcher(self._tokenizer, text, log_level=0)  # compiles, GIL released
        if m.is_error():
            raise ValidationError("guide", f"the {guide.kind.value} does not compile: {_first_line(m.get_error())}")
        with self._lock:
            self._compiled[guide] = m
            while len(self._compiled) > CACHED_GUIDES:
                self._compiled.popitem(last=False)
        return m


def _first_line(error: str) -> str:
    """llguidance's message without the source excerpt it appends."""
    return error.strip().splitlines()[0] if error.strip() else "invalid"


async def follow(guides: GuideCompiler | None, params: SamplingParams,
                 generated: tuple[int, ...] = ()) -> LLGuide | None:
    """make_guide off the event loop (a guide new to this process may take 0.1-1 s to compile)."""
    return await asyncio.to_thread(make_guide, guides, params, generated) if params.guide is not None else None


def make_guide(guides: GuideCompiler | None, params: SamplingParams, generated: Iterable[int] = ()) -> LLGuide | None:
    """The guide state a worker's Sequence of these params starts with (None: free text);
    ValidationError naming `guide` when it cannot be followed here."""
    if params.guide is None:
        return None
    if guides is None:
        raise ValidationError("guide", "structured output is off on this worker: its model folder has no "
                              "tokenizer.json that llguidance can read (see its log)")
    return guides.new(params.guide, generated)
