"""Structured output in the runtime: the mask of allowed tokens (against a plain loop), sampling
inside it, llguidance guides compiled from the default model's tokenizer, and the engine loop
(overlapped, batched with free-text requests) keeping each guided request to its language."""

from __future__ import annotations

import json
import random
import re
import threading

import pytest
import torch

from pdserve.core.block_manager import BlockManager
from pdserve.core.request import Finish, Sequence
from pdserve.core.sampling import Guide, GuideKind, SamplingParams, ValidationError
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.guided import GuideCompiler, make_guide
from pdserve.runtime.loop import EngineLoop
from pdserve.runtime.offline import generate
from pdserve.runtime.sampler import mask_disallowed, sample_on_device
from pdtest.masks import allowed_ids, bitmask

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_mask_disallowed_matches_a_plain_loop():
    rng = random.Random(0)
    vocab = 37  # not a multiple of 8: the last byte is partly past the vocabulary
    logits = torch.randn(5, vocab)
    keep = {0: rng.sample(range(vocab), 9), 2: [36], 3: rng.sample(range(16), 5)}
    allowed = [bitmask(keep[0], 5), None, bitmask(keep[2], 5), bitmask(keep[3], 2), None]  # row 3: a short mask
    before = logits.clone()
    out = mask_disallowed(logits, allowed)
    assert torch.equal(logits, before)  # the caller's tensor is left alone
    for b in range(5):
        for t in range(vocab):
            want = before[b, t] if b not in keep or t in keep[b] else float("-inf")
            assert out[b, t] == want, (b, t)


def test_sampling_keeps_to_the_allowed_tokens():
    vocab, rows = 300, 4
    logits = torch.randn(rows, vocab)
    keep = [[5, 17, 250], [299], list(range(0, 300, 7)), [1, 2]]
    allowed = [bitmask(k, 38) for k in keep]
    greedy = SamplingParams(temperature=0.0)
    drawn = SamplingParams(temperature=1.0, top_p=0.95)
    seen: list[set[int]] = [set() for _ in range(rows)]
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        toks = sample_on_device(logits, [greedy, drawn, drawn, drawn], [3] * rows, None, g, allowed).tolist()
        for b, t in enumerate(toks):
            seen[b].add(t)
    assert seen[0] == {max(keep[0], key=lambda t: logits[0, t].item())}  # the best allowed, not the best
    for b in range(1, rows):
        assert seen[b] <= set(keep[b])
    assert len(seen[2]) > 3  # drawn, not pinned to one token


@pytest.fixture(scope="module")
def offline_runner(default_model_dir):
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    return ModelRunner(ModelSpec.from_dir(default_model_dir), default_model_dir, num_blocks=256, block_size=16)


@pytest.fixture(scope="module")
def guides(default_model_dir):
    from pdserve.model.spec import ModelSpec

    return GuideCompiler.for_model(default_model_dir, ModelSpec.from_dir(default_model_dir).eos_token_ids)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from gateway.tokenizer import load_tokenizer

    return load_tokenizer(default_model_dir)


@pytest.mark.parametrize("guide, text", [
    (Guide(GuideKind.JSON, json.dumps(SCHEMA)), '{"name": "Bob", "age": 31}'),
    (Guide(GuideKind.JSON, '{"type": "object"}'), '{"a": [1, {"b": null}]}'),
    (Guide(GuideKind.CHOICE, '["yes", "no \\"way\\" \u00e9"]'), 'no "way" \u00e9'),
    (Guide(GuideKind.REGEX, r"[0-9]{3}-[0-9]{4}"), "555-0199"),
    (Guide(GuideKind.GRAMMAR, 'start: "x" y\ny: "ab" "ab"'), "xabab"),
])
def test_a_guide_accepts_its_text_then_allows_only_eos(guides, tokenizer, guide, text):
    g = guides.new(guide)
    assert all(g.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    eos = guides._tokenizer.eos_tokens
    assert allowed_ids(g.allowed(), guides.vocab_size) == list(eos)


def test_masks_of_a_step_equal_each_guides_own(guides, tokenizer):
    """GuideCompiler.masks (llguidance's thread pool) gives what each guide's allowed() gives,
    for guides in different states (a JSON string open, a number, done) and a foreign guide."""
    text = '{"name": "Bob", "age": 31}'
    ids = tokenizer.encode(text, add_special_tokens=False)
    schema = Guide(GuideKind.JSON, json.dumps(SCHEMA))
    states = [guides.new(schema, ids[:n]) for n in (0, 3, 4, len(ids) - 2, len(ids))]
    states.append(guides.new(Guide(GuideKind.CHOICE, '["yes", "no"]')))

    class Foreign:
        def allowed(self) -> bytes:
            return b"\x05"

    ids = lambda mask: allowed_ids(mask, guides.vocab_size)  # noqa: E731 (llguidance's masks carry padding)

    batch = [states[0], Foreign(), *states[1:]]
    want = [ids(g.allowed()) for g in batch]
    assert [ids(m) for m in guides.masks(batch)] == want
    assert ids(guides.masks([states[2]])[0]) == want[3] and guides.masks([]) == []
    assert len({tuple(m) for m in want}) == len(want)  # the states differ: the test can tell them apart


def test_a_guide_refuses_what_leaves_it(guides, tokenizer):
    g = guides.new(Guide(GuideKind.CHOICE, '["yes", "no"]'))
    assert not g.accept(tokenizer.encode("maybe", add_special_tokens=False)[0])
    with pytest.raises(ValidationError, match="already generated leaves"):
        guides.new(Guide(GuideKind.REGEX, "[0-9]+"), tokenizer.encode("abc", add_special_tokens=False))


@pytest.mark.parametrize("guide, why", [
    (Guide(GuideKind.REGEX, "("), "regex does not compile"),
    (Guide(GuideKind.JSON, '{"type": "foo"}'), "json does not compile"),
    (Guide(GuideKind.GRAMMAR, "start: nowhere"), "grammar does not compile"),
])
def test_a_guide_that_does_not_compile_is_refused_naming_the_field(guides, guide, why):
    with pytest.raises(ValidationError, match=why) as err:
        guides.check(guide)
    assert err.value.field == "guide"


def test_without_a_tokenizer_a_guided_request_is_refused(tmp_path):
    assert GuideCompiler.for_model(tmp_path, (0,)) is None
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordLevel", "vocab": {"a": 0}}}')
    unreadable = GuideCompiler.for_model(tmp_path, (0,))  # read on first use, not at start
    for _ in range(2):  # refused by field, not a crash, every time
        with pytest.raises(ValidationError, match="cannot read the model's tokenizer.json") as err:
            make_guide(unreadable, SamplingParams(guide=Guide(GuideKind.REGEX, "a")))
        assert err.value.field == "guide"
    with pytest.raises(ValidationError, match="tokenizer.json") as err:
        make_guide(None, SamplingParams(guide=Guide(GuideKind.REGEX, "a")))
    assert err.value.field == "guide"
    assert make_guide(None, SamplingParams()) is None


def run_loop(runner, seqs: list[Sequence], guide_masks=None) -> tuple[dict[str, list[int]], dict[str, Finish]]:
    """The sequences through one overlapped engine loop: tokens and finish by request (leak
    check at the end)."""
    sched = Scheduler(SchedulerConfig(max_model_len=256), BlockManager(runner.num_blocks - 1, runner.block_size),
                      guide_masks=guide_masks)
    loop = EngineLoop(sched, runner, overlap=True)
    tokens: dict[str, list[int]] = {s.request_id: [] for s in seqs}
    finish: dict[str, Finish] = {}
    done = threading.Event()

    def sink(ev) -> None:
        if ev.token >= 0:
            tokens[ev.request_id].append(ev.token)
        if ev.finish is not None:
            finish[ev.request_id] = ev.finish
            if len(finish) == len(seqs):
                done.set()

    loop.start()
    try:
        for s in seqs:
            loop.submit(s, sink)
        assert done.wait(120), f"unfinished: {set(tokens) - set(finish)}"
    finally:
        loop.stop()
    assert sched._guided == 0 and sched.blocks.num_free == sched.blocks.num_total
    return tokens, finish


def chat(tokenizer, text: str) -> list[int]:
    from gateway.tokenizer import encode_prompt

    return encode_prompt(tokenizer, messages=[("user", text)])


def test_the_engine_loop_keeps_guided_requests_to_their_language(offline_runner, guides, tokenizer):
    """Guided and free requests in one overlapped loop: each guided output is in its language
    and ends with EOS, greedy ones equal the single-process oracle's, and the free request's
    tokens equal its run alone (the masks touch only their own rows). Leak check at the end."""
    runner, eos = offline_runner, offline_runner.spec.eos_token_ids
    person = chat(tokenizer, "Describe a person as JSON with a name and an age.")
    number = chat(tokenizer, "Give me a phone number.")
    free = chat(tokenizer, "Name three colours.")
    cases = {
        "json": (person, SamplingParams(temperature=0.0, max_tokens=40, guide=Guide(GuideKind.JSON, json.dumps(SCHEMA)))),
        "choice": (person, SamplingParams(temperature=0.0, max_tokens=8, guide=Guide(GuideKind.CHOICE, '["yes", "no"]'))),
        "regex": (number, SamplingParams(temperature=1.0, seed=7, max_tokens=16,
                                         guide=Guide(GuideKind.REGEX, r"[0-9]{3}-[0-9]{4}"))),
        "object": (person, SamplingParams(temperature=0.8, seed=3, max_tokens=60,
                                          guide=Guide(GuideKind.JSON, '{"type": "object", "maxProperties": 2}'))),
        "free": (free, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)),
    }
    pending, real_launch = [], runner.launch

    def launch(step, hook=None):  # counts the overlapped steps that sampled once given masks
        out = real_launch(step, hook)
        pending.append(getattr(out, "needs_masks", False))
        return out

    runner.launch = launch
    try:
        seqs = [Sequence(rid, list(prompt), params, eos, guide=make_guide(guides, params))
                for rid, (prompt, params) in cases.items()]
        tokens, finish = run_loop(runner, seqs, guides.masks)
    finally:
        del runner.launch
    assert sum(pending) >= 10, pending  # guided rows rode overlapped steps
    text = {k: tokenizer.decode(v[:-1] if finish[k] is Finish.STOP else v) for k, v in tokens.items()}
    for rid in ("json", "choice", "regex", "object"):
        assert finish[rid] is Finish.STOP and tokens[rid][-1] in eos, (rid, text[rid])
    person_obj = json.loads(text["json"])
    assert set(person_obj) == {"name", "age"} and isinstance(person_obj["name"], str)
    assert isinstance(person_obj["age"], int)
    assert text["choice"] in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", text["regex"]), text["regex"]
    assert isinstance(json.loads(text["object"]), dict) and len(json.loads(text["object"])) <= 2
    for rid in ("json", "choice"):
        prompt, params = cases[rid]
        assert tokens[rid] == generate(runner, [prompt], params, eos, guides)[0]
    assert tokens["free"] == generate(runner, [free], cases["free"][1], eos)[0]


class StrideGuide:
    """A synthetic guide (no tokenizer): allows the ids t with (t * 7 + 13 * step) % 5 == 0,
    the allowed set moving with every token accepted; refuses anything else."""

    def __init__(self, vocab: int) -> None:
        self.vocab, self.steps = vocab, 0

    def ids(self) -> list[int]:
        return [t for t in range(self.vocab) if (t * 7 + 13 * self.steps) % 5 == 0]

    def allowed(self) -> bytes:
        return bitmask(self.ids(), (self.vocab + 7) // 8)

    def accept(self, token: int) -> bool:
        ok = token in self.ids()
        self.steps += 1
        return ok


@pytest.mark.gpu
def test_cuda_guided_decode_keeps_to_the_mask_in_graphs_and_eager():
    """On CUDA (bf16, random weights): guided greedy and sampled rows beside free rows, through
    the CUDA-graph decode and the eager path: every token is allowed (else the guide aborts the
    request), greedy guided tokens are the same in both paths, and the free rows equal their
    run without the guided ones."""
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512))
    kw = dict(device="cuda", dtype=torch.bfloat16, num_blocks=129, block_size=16, load_format="dummy",
              max_model_len=256, max_num_seqs=8)
    rng = random.Random(1)
    prompts = [[rng.randrange(spec.vocab_size) for _ in range(n)] for n in (5, 17, 40, 3)]

    def seqs(guided: bool) -> list[Sequence]:
        out = []
        for i, p in enumerate(prompts):
            params = SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0, seed=i, max_tokens=24, ignore_eos=True)
            g = StrideGuide(spec.vocab_size) if guided and i < 3 else None
            out.append(Sequence(f"r{i}", list(p), params, (), guide=g))
        return out

    from pdserve.runtime.runner import PendingSampling

    real_give, given = PendingSampling.give_masks, []

    def give_masks(self, masks):  # queued, never waited for: the host must not sync here
        torch.cuda.set_sync_debug_mode("error")
        try:
            real_give(self, masks)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        given.append(len(masks))

    results = {}
    PendingSampling.give_masks = give_masks
    try:
        for eager in (False, True):
            runner = ModelRunner(spec, None, enforce_eager=eager, **kw)
            results[eager] = run_loop(runner, seqs(True))
            tokens, finish = results[eager]
            assert all(f is Finish.LENGTH for f in finish.values()), finish
            assert all(len(t) == 24 for t in tokens.values())
            free = run_loop(runner, seqs(False))[0]
            assert tokens["r3"] == free["r3"]
            assert tokens["r0"] != free["r0"]  # the mask changed the greedy tokens
    finally:
        PendingSampling.give_masks = real_give
    assert sum(given) >= 20  # guided rows sampled in overlapped steps, given their masks late
    assert results[False][0]["r0"] == results[True][0]["r0"]
    assert results[False][0]["r2"] == results[True][0]["r2"]


def _accepts(guides, tokenizer, guide: Guide, text: str) -> bool:
    g = guides.new(guide)
    return all(g.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("body", [
    {"guided_json": {"type": "object", "properties": {"a": {"type": "integer"}}}, "guided_whitespace_pattern": "[\n ]{0,3}"},
    {"response_format": {"type": "json_object"}, "guided_whitespace_pattern": "[\n ]{0,3}"},
    {"structured_outputs": {"json": {"type": "object"}, "whitespace_pattern": "[\n ]{0,3}"}},
])
def test_a_whitespace_pattern_lets_json_have_that_whitespace(guides, tokenizer, body):
    """vLLM's guided_whitespace_pattern: JSON may have the pattern's whitespace between tokens
    (compact JSON still passes); without it JSON is compact only."""
    from gateway.generation import sampling_from_request
    from gateway.openai_schema import sampling

    guide = sampling_from_request(sampling(body, chat=True)).guide
    assert _accepts(guides, tokenizer, guide, '{\n  "a":1 }') and _accepts(guides, tokenizer, guide, '{"a":1}')
    assert not _accepts(guides, tokenizer, guide, '{\n\n\n\n"a": 1}')  # four: more than the pattern
    compact = {k: v for k, v in body.items() if k != "guided_whitespace_pattern"}
    compact.get("structured_outputs", {}).pop("whitespace_pattern", None)
    plain = sampling_from_request(sampling(compact, chat=True)).guide
    assert _accepts(guides, tokenizer, plain, '{"a": 1}') and not _accepts(guides, tokenizer, plain, '{\n"a": 1}')


def _complete(guides, tokenizer, guide: Guide, text: str) -> bool:
    """text is a sentence of the guide's language (its tokens accepted, then EOS allowed)."""
    g = guides.new(guide)
    ok = all(g.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return ok and set(guides._tokenizer.eos_tokens) <= set(allowed_ids(g.allowed(), guides.vocab_size))


@pytest.mark.parametrize("kind, value, answer", [
    (GuideKind.JSON, json.dumps(SCHEMA), '{"name": "Bob", "age": 31}'), (GuideKind.REGEX, "[A-Z][a-z]+", "Paris"),
    (GuideKind.CHOICE, '["yes", "no"]', "yes"), (GuideKind.GRAMMAR, 'start: "x" y\ny: "ab"', "xab"),
])
def test_a_guide_after_the_reasoning(guides, tokenizer, kind, value, answer):
    """Guide.reasoning "open": any text up to the first "</think>" and whitespace, then the
    language; "optional": an optional "<think>...</think>" first; "": the language alone."""
    cases = {"<think>hm, a </ think></think>\n\n": (True, True), "hm</think>\n": (True, False), "": (False, True),
             "x</think>" + answer + "</think>": (False, False)}
    for before, (in_open, in_optional) in cases.items():
        assert _complete(guides, tokenizer, Guide(kind, value, "open"), before + answer) is in_open, before
        assert _complete(guides, tokenizer, Guide(kind, value, "optional"), before + answer) is in_optional, before
    assert not _complete(guides, tokenizer, Guide(kind, value), "<think>a</think>" + answer)
    with pytest.raises(ValidationError, match="reasoning"):
        guides.check(Guide(kind, value, "always"))
