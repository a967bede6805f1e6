"""The gateway's OpenAI-compatible HTTP face, driven by the official `openai` client, unchanged."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")  # a test extra (pyproject.toml); the GPU machine lacks it

from pdserve.client import Client, build_request  # noqa: E402
from pdserve.launch import Stack, free_port  # noqa: E402
from pdtest.stack import assert_no_leaks, openai_client  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def http(default_model_dir):
    """(stack, base_url): gateway with --http-port and a queue of 2 (to show 429)."""
    port = free_port()
    with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "512"],
               gateway_args=["--max-model-len", "512", "--http-port", str(port),
                             "--max-queued-requests", "2"]) as st:
        yield st, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def client(http):
    yield from openai_client(*http)


def test_models(client, default_model_dir):
    assert [m.id for m in client.models.list().data] == [default_model_dir.name]
    assert client.models.retrieve(default_model_dir.name).id == default_model_dir.name
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("other-model")
    assert err.value.body["param"] == "model" and "other-model" in err.value.body["message"]


def test_service_endpoints(http, client):
    """vLLM's /ping and /version, and the Prometheus metrics on the API port too."""
    root = http[1].removesuffix("/v1")
    client.completions.create(model="", prompt="Hello", max_tokens=2)
    for path in ("/ping", "/health"):
        with urllib.request.urlopen(root + path, timeout=30) as r:
            assert r.status == 200
    with urllib.request.urlopen(urllib.request.Request(root + "/ping", data=b"", method="POST"), timeout=30) as r:
        assert r.status == 200
    with urllib.request.urlopen(root + "/version", timeout=30) as r:
        assert json.loads(r.read()) == {"version": importlib.metadata.version("pdserve")}
    with urllib.request.urlopen(root + "/metrics", timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    counts = [line for line in text.splitlines() if line.startswith("pdserve:e2e_request_latency_seconds_count")]
    assert counts and float(counts[0].split()[-1]) >= 1, text[:500]


def test_completion_equals_grpc_and_reports_usage(http, client):
    stack, _ = http
    r = client.completions.create(model="", prompt="The quick brown fox", max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    with Client(stack.gateway) as g:
        text, ids, done = g.generate(text="The quick brown fox", max_tokens=8, temperature=0.0, ignore_eos=True)
    assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens == done.usage.prompt_tokens
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8 and r.id.startswith("cmpl-")


def test_streamed_completion_with_usage(client):
    kw = dict(model="", prompt="Once upon a time", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_streaming_chat_returns_text(client):
    stream = client.chat.completions.create(model="", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                            max_tokens=16, temperature=0, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert "Paris" in text
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason == "stop"


def test_chat_whole(client):
    r = client.chat.completions.create(model="", messages=[{"role": "user", "content": "What is the capital of France?"}],
                                       max_tokens=16, temperature=0)
    assert "Paris" in r.choices[0].message.content and r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens > 0 and r.object == "chat.completion"


@pytest.mark.parametrize("kw, param", [
    ({"temperature": -1}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"), ({"n": 3}, "n"), ({"temperature": "hot"}, "temperature"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"response_format": {"type": "xml"}}, "response_format.type"), ({"seed": -1}, "seed"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"messages": [{"role": "user", "content": "hi " * 600}]}, "messages"),
    ({"logprobs": 2}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 1.5}, "min_p"),
    ({"logit_bias": {"1000000": 5}}, "logit_bias"), ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"echo": True}, "echo"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
    ({"prompt_logprobs": True}, "prompt_logprobs"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
])
def test_bad_parameter_is_400_naming_it(client, kw, param):
    body = {"model": "", "messages": [{"role": "user", "content": "Hi"}], **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{k: v for k, v in body.items() if k in ("model", "messages")},
                                       extra_body={k: v for k, v in body.items() if k not in ("model", "messages")})
    assert err.value.status_code == 400 and err.value.body["param"] == param
    assert err.value.body["message"].startswith(param)


def test_penalties_equal_grpc_and_change_greedy_text(http, client):
    """OpenAI's presence/frequency penalties and vLLM's repetition_penalty reach the workers: the
    completion equals the gRPC one with the same penalties, and differs from the plain one."""
    stack, _ = http
    prompt, pen = "one two one two one two one two", {"frequency_penalty": 1.5, "presence_penalty": 0.5,
                                                      "repetition_penalty": 1.2}
    kw = dict(model="", prompt=prompt, max_tokens=12, temperature=0)
    got = client.completions.create(**kw, frequency_penalty=1.5, presence_penalty=0.5,
                                    extra_body={"ignore_eos": True, "repetition_penalty": 1.2}).choices[0].text
    plain = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    with Client(stack.gateway) as g:
        text, _, _ = g.generate(text=prompt, max_tokens=12, temperature=0.0, ignore_eos=True, **pen)
    assert got == text and got != plain


def test_logit_bias_forces_a_token_and_min_p_one_is_greedy(http, client):
    """+100 on one token makes it every token of a sampled completion; min_p 1 keeps only the most
    likely token, so a hot sampled completion equals the greedy one."""
    kw = dict(model="", prompt="The weather today", max_tokens=6, extra_body={"ignore_eos": True})
    forced = client.completions.create(**kw, temperature=1.0, logit_bias={"504": 100}, logprobs=0).choices[0]
    assert forced.logprobs.tokens == [forced.logprobs.tokens[0]] * 6 and forced.text == forced.logprobs.tokens[0] * 6
    greedy = client.completions.create(**kw, temperature=0).choices[0].text
    hot = client.completions.create(model="", prompt="The weather today", max_tokens=6, temperature=1.5, seed=1,
                                    extra_body={"ignore_eos": True, "min_p": 1.0}).choices[0].text
    assert hot == greedy


def test_echo_prepends_the_prompt_whole_and_streamed(client, default_model_dir):
    kw = dict(model="", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(prompt="The sky is", **kw).choices[0].text
    whole = client.completions.create(prompt="The sky is", echo=True, **kw)
    assert whole.choices[0].text == "The sky is" + plain and whole.usage.completion_tokens == 5
    streamed = client.completions.create(prompt="The sky is", echo=True, stream=True, **kw)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "The sky is" + plain
    from gateway.tokenizer import load_tokenizer

    ids = load_tokenizer(default_model_dir).encode("The sky is")
    assert client.completions.create(prompt=ids, echo=True, **kw).choices[0].text == "The sky is" + plain


@pytest.fixture(scope="module")
def words(default_model_dir):
    """(tokenizer, TokenText): how the gateway shows each token."""
    from gateway.detokenizer import ByteTable
    from gateway.openai_schema import TokenText
    from gateway.tokenizer import load_tokenizer

    tok = load_tokenizer(default_model_dir)
    return tok, TokenText(tok, ByteTable.build(tok))


SCORED = "The quick brown fox jumps over the lazy dog"


def _grpc_prompt_logprobs(stack, ids: list[int], n: int):
    """The gRPC API's first chunk for ids with prompt_logprobs=n (prompt_logprobs: one per token after the first)."""
    with Client(stack.gateway) as g:
        chunks = [m.chunk for m in g.stream(build_request(token_ids=ids, max_tokens=1, temperature=0.0,
                                                          prompt_logprobs=n), timeout=60) if m.HasField("chunk")]
    assert list(chunks[0].prompt_token_ids) == ids and len(chunks[0].prompt_logprobs) == len(ids) - 1
    return chunks[0]


def test_echo_with_logprobs_scores_the_prompt_as_the_grpc_api(http, client, words):
    """lm-evaluation-harness's loglikelihood request (local-completions): the choice's logprobs
    start with the prompt's tokens, the first one's null, the others' equal the gRPC API's prompt
    logprobs; then the generated token's, as without echo. Whole == streamed; a text prompt too."""
    stack, _ = http
    tok, text = words
    ids = tok.encode(SCORED)
    body = dict(model="", max_tokens=1, temperature=0, logprobs=2, echo=True, seed=1234)
    r = client.completions.create(prompt=ids, **body)
    c, lp = r.choices[0], r.choices[0].logprobs
    plain = client.completions.create(model="", prompt=ids, max_tokens=1, temperature=0, logprobs=2).choices[0]
    assert c.text == tok.decode(ids) + plain.text and c.text.startswith(SCORED)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids) + 1
    assert lp.tokens == [text.string(t) for t in ids] + plain.logprobs.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    first = _grpc_prompt_logprobs(stack, ids, 2)
    assert lp.token_logprobs[1:-1] == pytest.approx([e.logprob for e in first.prompt_logprobs], abs=1e-5)
    for top, e in zip(lp.top_logprobs[1:-1], first.prompt_logprobs):
        assert list(top) == [text.string(t) for t in e.top_token_ids]
        assert list(top.values()) == pytest.approx(list(e.top_logprobs), abs=1e-5)
    assert lp.token_logprobs[-1] == pytest.approx(plain.logprobs.token_logprobs[0], abs=1e-5)
    assert lp.top_logprobs[-1] == pytest.approx(plain.logprobs.top_logprobs[0], abs=1e-5)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] == len(tok.decode(ids))
    assert all(c.text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens))
    ctxlen = 4  # as the harness reads it: the continuation's logprob, and whether greedy picks each of its tokens
    want = first.prompt_logprobs[ctxlen - 1:]
    assert sum(lp.token_logprobs[ctxlen:-1]) == pytest.approx(sum(e.logprob for e in want), abs=1e-4)
    assert [t == max(top.values()) for t, top in zip(lp.token_logprobs[ctxlen:-1], lp.top_logprobs[ctxlen:-1])] == [
        e.top_token_ids[0] == t for e, t in zip(want, ids[ctxlen:])]

    events = [e.choices[0] for e in client.completions.create(prompt=ids, stream=True, **body) if e.choices]
    assert events[0].text == tok.decode(ids) and events[0].logprobs.tokens == lp.tokens[:len(ids)]
    assert "".join(e.text for e in events) == c.text
    parts = [e.logprobs for e in events if e.logprobs is not None]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in getattr(p, key)] == getattr(lp, key), key

    by_text = client.completions.create(prompt=SCORED, **body).choices[0]
    assert by_text.text == c.text and by_text.logprobs.tokens == lp.tokens
    assert by_text.logprobs.text_offset == lp.text_offset
    assert by_text.logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    batch = client.completions.create(prompt=[ids[:3], ids], **body).choices  # the harness batches prompts
    assert [len(b.logprobs.tokens) for b in batch] == [4, len(ids) + 1]
    assert batch[1].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert batch[0].logprobs.token_logprobs[1:3] == pytest.approx(lp.token_logprobs[1:3], abs=1e-5)


def test_vllm_prompt_logprobs_extension(http, client, words):
    """vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}}, ...] per choice on
    /v1/completions (the prompt's token first, then the top N ranked 1..N), on the response on chat."""
    stack, url = http
    tok, text = words
    ids = tok.encode(SCORED)
    first = _grpc_prompt_logprobs(stack, ids, 3)
    kw = dict(model="", prompt=ids, max_tokens=2, temperature=0, n=2)
    raw = client.completions.with_raw_response.create(**kw, extra_body={"prompt_logprobs": 3}).http_response.json()
    plain = client.completions.create(**kw)
    assert [c["text"] for c in raw["choices"]] == [c.text for c in plain.choices]
    assert raw["choices"][0]["prompt_logprobs"] == raw["choices"][1]["prompt_logprobs"]
    plp = raw["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None and raw["choices"][0]["logprobs"] is None
    for token, entry, e in zip(ids[1:], plp[1:], first.prompt_logprobs):
        keys = [str(token)] + [str(t) for t in e.top_token_ids if t != token]
        assert list(entry) == keys  # the prompt's token first, then the top ones
        mine = entry[str(token)]
        assert mine["logprob"] == pytest.approx(e.logprob, abs=1e-5) and mine["decoded_token"] == text.string(token)
        assert mine["rank"] == e.rank >= 1  # the workers' rank in the whole vocabulary
        if token in e.top_token_ids:
            assert mine["rank"] == list(e.top_token_ids).index(token) + 1
        for rank, (t, v) in enumerate(zip(e.top_token_ids, e.top_logprobs), 1):
            want = {"logprob": pytest.approx(v, abs=1e-5), "rank": rank, "decoded_token": text.string(t)}
            assert entry[str(t)] == (want if t != token else {**want, "logprob": pytest.approx(e.logprob, abs=1e-5)})
    assert any(entry[str(t)]["rank"] > 3 for t, entry in zip(ids[1:], plp[1:]))  # some prompt token is unlikely
    none = client.completions.with_raw_response.create(**kw).http_response.json()
    assert "prompt_logprobs" not in none["choices"][0]
    zero = client.completions.with_raw_response.create(**{**kw, "n": 1}, extra_body={"prompt_logprobs": 0})
    zero_plp = zero.http_response.json()["choices"][0]["prompt_logprobs"]
    assert [list(e) for e in zero_plp[1:]] == [[str(t)] for t in ids[1:]]
    chat = client.chat.completions.with_raw_response.create(
        model="", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0,
        extra_body={"prompt_logprobs": 1}).http_response.json()
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"] and chat["prompt_logprobs"][0] is None
    assert all(len(e) in (1, 2) for e in chat["prompt_logprobs"][1:]) and "prompt_logprobs" not in chat["choices"][0]


def _greedy_and_aligned(tokens: list[str], logprobs: list[float], tops: list[dict[str, float]], width: int) -> None:
    """Greedy picks each token as the most likely one: its logprob is its top-1's, and <= 0."""
    assert len(tokens) == len(logprobs) == len(tops) and all(len(top) == width for top in tops)
    for token, logprob, top in zip(tokens, logprobs, tops):
        assert max(top, key=top.get) == token and top[token] == logprob <= 0
        assert list(top.values()) == sorted(top.values(), reverse=True)


def test_completion_logprobs_whole_and_streamed(client):
    kw = dict(model="", prompt="The quick brown fox", max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    c, lp = r.choices[0], r.choices[0].logprobs
    assert c.finish_reason == "length" and len(lp.tokens) == r.usage.completion_tokens == 6
    _greedy_and_aligned(lp.tokens, lp.token_logprobs, lp.top_logprobs, 3)
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [len("".join(lp.tokens[:k])) for k in range(6)]
    chunks = [ch.choices[0] for ch in client.completions.create(stream=True, **kw) if ch.choices]
    parts = [ch.logprobs for ch in chunks if ch.logprobs is not None]
    assert all(ch.text == "".join(p.tokens) for ch, p in zip(chunks, parts))  # each event: its tokens' text
    assert [t for p in parts for t in p.tokens] == lp.tokens
    assert [o for p in parts for o in p.text_offset] == lp.text_offset
    assert [x for p in parts for x in p.token_logprobs] == pytest.approx(lp.token_logprobs, abs=1e-5)
    assert chunks[-1].finish_reason == "length" and chunks[-1].logprobs is None
    raw = client.completions.with_raw_response.create(**{**kw, "logprobs": None}).http_response.json()
    assert "logprobs" in raw["choices"][0] and raw["choices"][0]["logprobs"] is None
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**{**kw, "logprobs": 21})
    assert err.value.body["param"] == "logprobs"


def test_each_completion_choice_has_its_own_logprobs(client):
    kw = dict(model="", max_tokens=3, temperature=0, logprobs=0, extra_body={"ignore_eos": True})
    r = client.completions.create(prompt=["The quick brown fox", "Once upon a time"], **kw)
    assert [len(c.logprobs.tokens) for c in r.choices] == [3, 3] and r.usage.completion_tokens == 6
    assert all("".join(c.logprobs.tokens) == c.text and c.logprobs.top_logprobs == [{}] * 3 for c in r.choices)
    assert r.choices[0].text != r.choices[1].text
    twice = client.completions.create(prompt="Once upon a time", n=2, **kw)
    assert [c.logprobs.tokens for c in twice.choices] == [r.choices[1].logprobs.tokens] * 2


def test_chat_logprobs_whole_and_streamed(client):
    kw = dict(model="", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16,
              temperature=0, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    c, content = r.choices[0], r.choices[0].logprobs.content
    assert c.finish_reason == "stop" and len(content) == r.usage.completion_tokens - 1  # the EOS is not listed
    tokens = [e.token for e in content]
    _greedy_and_aligned(tokens, [e.logprob for e in content],
                        [{t.token: t.logprob for t in e.top_logprobs} for e in content], 2)
    assert "".join(tokens) == c.message.content and "Paris" in c.message.content
    assert all(e.bytes == list(e.token.encode()) and e.top_logprobs[0].bytes == e.bytes for e in content)
    chunks = [ch.choices[0] for ch in client.chat.completions.create(stream=True, **kw)]
    parts = [ch.logprobs.content for ch in chunks if ch.logprobs is not None]
    assert all((ch.delta.content or "") == "".join(e.token for e in p)
               for ch, p in zip([ch for ch in chunks if ch.logprobs is not None], parts))
    assert [e.token for p in parts for e in p] == tokens
    assert [e.logprob for p in parts for e in p] == pytest.approx([e.logprob for e in content], abs=1e-5)
    assert chunks[0].logprobs is None and chunks[-1].finish_reason == "stop" and chunks[-1].logprobs is None
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == c.message.content


def test_streamed_logprobs_of_tokens_whose_text_is_held_back(client):
    """A token ending mid-character sends no text yet; its entry goes out with its own chunk all the same."""
    kw = dict(model="", messages=[{"role": "user", "content": "Write the Chinese word for cat"}], max_tokens=6,
              temperature=0, logprobs=True)
    whole = client.chat.completions.create(**kw).choices[0]
    content = whole.logprobs.content
    assert any(e.token.startswith("bytes:\\x") for e in content) and len(content) == 6
    assert bytes(b for e in content for b in e.bytes).decode(errors="replace") == whole.message.content
    chunks = [ch.choices[0] for ch in client.chat.completions.create(stream=True, **kw)]
    assert any(ch.logprobs is not None and not ch.delta.content for ch in chunks)  # entries, no text yet
    assert [e.token for ch in chunks if ch.logprobs for e in ch.logprobs.content] == [e.token for e in content]


def test_n_choices_draw_with_seed_plus_index(client):
    kw = dict(model="", prompt="Once upon a time", max_tokens=6, temperature=1.0, extra_body={"ignore_eos": True})
    r = client.completions.create(n=2, seed=7, **kw)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 12
    alone = [client.completions.create(seed=7 + j, **kw) for j in (0, 1)]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    assert r.choices[0].text != r.choices[1].text and r.usage.prompt_tokens == alone[0].usage.prompt_tokens


def test_a_batch_of_prompts_answers_each_in_order(client):
    prompts = ["The quick brown fox", "Once upon a time"]
    kw = dict(model="", max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    r = client.completions.create(prompt=prompts, **kw)
    alone = [client.completions.create(prompt=p, **kw) for p in prompts]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone] and [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone) and r.usage.completion_tokens == 10
    chunks = list(client.completions.create(prompt=prompts, stream=True, stream_options={"include_usage": True}, **kw))
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)]
    assert texts == [a.choices[0].text for a in alone]
    finishes = [(c.choices[0].index, c.choices[0].finish_reason) for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [(0, "length"), (1, "length")] and chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_streamed_chat_choices_each_start_with_the_role(client):
    chunks = list(client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Name a colour."}], n=2, seed=3, temperature=1.0,
        max_tokens=4, stream=True))
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason in ("stop", "length")


def test_a_client_gone_mid_stream_aborts_every_choice(http):
    stack, url = http
    body = json.dumps({"model": "", "prompt": ["Once upon a time", "The quick brown fox"], "max_tokens": 400,
                       "temperature": 0, "ignore_eos": True, "stream": True}).encode()
    req = urllib.request.Request(url + "/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        seen = set()
        while len(seen) < 2:  # both choices are generating
            line = resp.readline()
            if line.startswith(b"data: {"):
                seen.add(json.loads(line[6:])["choices"][0]["index"])
    assert_no_leaks(stack, timeout=10.0)  # long before 400 tokens each


@pytest.mark.parametrize("kw, param, words", [
    ({"prompt": ["Hi", "x " * 600]}, "prompt[1]", "max_model_len"),
    ({"prompt": "Hi", "extra_body": {"n": 3}}, "n", "--max-queued-requests (2)"),
])
def test_a_choice_that_cannot_run_fails_the_request_naming_it(client, kw, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="", max_tokens=4, **kw)
    assert err.value.body["param"] == param and err.value.body["message"].startswith(param + ": ")
    assert words in err.value.body["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="Hi", max_tokens=2)


@pytest.mark.parametrize("method, path, status", [("POST", "/embeddings", 404), ("GET", "/completions", 405),
                                                   ("POST", "/chat/completions", 413)])
def test_http_errors_are_openai_error_objects(http, method, path, status):
    _, url = http
    data = b"{" + b" " * (17 << 20) + b"}" if status == 413 else (b"{}" if method == "POST" else None)
    req = urllib.request.Request(url + path, data=data, method=method, headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == status
    error = json.loads(err.value.read())["error"]
    assert error["message"].startswith(f"{method} /v1{path}: ") and error["type"] == "invalid_request_error"
    if status == 405:
        assert "POST" in err.value.headers["Allow"]


def test_backpressure_is_429_with_retry_after(http):
    stack, url = http

    async def one(c: openai.AsyncOpenAI, i: int):
        try:
            return await c.completions.create(model="", prompt=f"{i} Tell me a story " * 30, max_tokens=4,
                                              temperature=0, extra_body={"ignore_eos": True})
        except openai.RateLimitError as e:
            return e

    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as c:
            return list(await asyncio.gather(*(one(c, i) for i in range(12))))

    results = asyncio.run(main())
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert limited and len(limited) < 12
    assert all(int(e.response.headers["retry-after"]) >= 1 for e in limited)
    assert all(r.usage.completion_tokens == 4 for r in results if not isinstance(r, Exception))
    assert_no_leaks(stack)


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_tokenize_and_detokenize_as_vllm(http, client, words):
    """/tokenize counts what the gateway sends (a completion's and a chat's prompt_tokens);
    /detokenize gives the text back; bad bodies are 400 naming the parameter."""
    _, url = http
    root = url[: -len("/v1")]
    status, got = _post(root + "/tokenize", {"prompt": "The quick brown fox", "return_token_strs": True})
    r = client.completions.create(model="", prompt="The quick brown fox", max_tokens=1, temperature=0)
    assert status == 200 and got["count"] == len(got["tokens"]) == r.usage.prompt_tokens
    assert got["max_model_len"] == 512 and "".join(got["token_strs"]) == "The quick brown fox"
    assert _post(root + "/detokenize", {"tokens": got["tokens"]}) == (200, {"prompt": "The quick brown fox"})
    messages = [{"role": "user", "content": "Hi there"}]
    status, chat = _post(root + "/tokenize", {"model": "", "messages": messages})
    r = client.chat.completions.create(model="", messages=messages, max_tokens=1, temperature=0)
    assert status == 200 and chat["count"] == r.usage.prompt_tokens
    _, bare = _post(root + "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert bare["tokens"] == chat["tokens"][: bare["count"]] and bare["count"] < chat["count"]
    for path, body, param in (("/tokenize", {}, "prompt"), ("/tokenize", {"prompt": "a", "messages": messages}, "prompt"),
                              ("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"messages": [{"role": "x"}]},
                                                                       "messages[0].role"),
                              ("/tokenize", {"prompt": "a", "add_special_tokens": "no"}, "add_special_tokens"),
                              ("/detokenize", {"tokens": [1, -1]}, "tokens"), ("/detokenize", {"tokens": "1"}, "tokens")):
        status, err = _post(root + path, body)
        assert status == 400 and err["error"]["param"] == param, (path, body, err)
    assert _post(root + "/tokenize", {"model": "nope", "prompt": "a"})[0] == 404


def test_vllm_text_options(client):
    """vLLM's include_stop_str_in_output, skip_special_tokens and truncate_prompt_tokens; its
    sampling extras this server lacks are refused by name unless they ask for nothing."""
    kw = dict(model="", prompt="The quick brown fox jumps over the lazy dog and", max_tokens=30, temperature=0)
    plain = client.completions.create(**kw, stop=[" "]).choices[0]
    kept = client.completions.create(**kw, stop=[" "], extra_body={"include_stop_str_in_output": True}).choices[0]
    assert plain.finish_reason == kept.finish_reason == "stop" and kept.text == plain.text + " "
    forced = dict(model="", prompt="Hi", max_tokens=2, temperature=0, logit_bias={"1": 100},  # <|im_start|>
                  extra_body={"ignore_eos": True})
    assert client.completions.create(**forced).choices[0].text == ""
    shown = client.completions.create(**{**forced, "extra_body": {"ignore_eos": True, "skip_special_tokens": False}})
    assert shown.choices[0].text == "<|im_start|><|im_start|>"
    long = client.completions.create(**kw, extra_body={"truncate_prompt_tokens": 4})
    assert long.usage.prompt_tokens == 4
    for extra, param in (({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"allowed_token_ids": [5]}, "allowed_token_ids"),
                         ({"use_beam_search": True}, "use_beam_search"), ({"skip_special_tokens": "no"}, "skip_special_tokens")):
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(**kw, extra_body=extra)
        assert err.value.body["param"] == param, err.value.body
    assert client.completions.create(**kw, extra_body={"use_beam_search": False, "bad_words": []}).choices[0].text
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**kw, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert err.value.body["param"] == "stream_options.continuous_usage_stats"


KEY, OTHER_KEY, ORIGIN = "e2e-secret-1", "e2e-secret-2", "https://app.example"


@pytest.fixture(scope="module")
def guarded(http, default_model_dir):
    """(gRPC address, base url) of a second gateway, in front of the same workers, with two
    --api-key and --allowed-origins."""
    workers = http[0].workers
    port = free_port()
    st = Stack(model=str(default_model_dir))
    try:
        st.wait([st.spawn("gateway", "gateway", [
            f"--prefill={workers['prefill']}", f"--decode={workers['decode']}", "--max-model-len", "512",
            "--http-port", str(port), "--api-key", KEY, "--api-key", OTHER_KEY,
            "--allowed-origins", json.dumps([ORIGIN])])], 120)
        yield st.gateway, f"http://127.0.0.1:{port}/v1"
    finally:
        st.stop()


def _call(url: str, body: dict | None = None, headers: dict | None = None, method: str | None = None
          ) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one request to url (a JSON body makes it a POST)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json",
                                                                         **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_api_key_guards_the_openai_face_but_not_the_probes(http, guarded):
    """vLLM's --api-key: 401 (an OpenAI error naming the header, never the key) without the key or
    with a wrong one, on /v1 and /tokenize; the OpenAI SDK with either key is served; the probes stay open."""
    _, url = guarded
    root = url.removesuffix("/v1")
    chat = {"model": "", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for path, body in (("/v1/models", None), ("/v1/chat/completions", chat), ("/v1/completions", {"prompt": "a"}),
                       ("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
        for headers, code in (({}, "missing_api_key"), ({"Authorization": "Bearer wrong"}, "invalid_api_key"),
                              ({"Authorization": KEY}, "invalid_api_key")):
            status, got, raw = _call(root + path, body, headers)
            assert status == 401 and got["WWW-Authenticate"] == "Bearer", (path, headers, status)
            error = json.loads(raw)["error"]
            assert error["code"] == code and "`Authorization` header" in error["message"], error
            assert b"e2e-secret" not in raw
    for path in ("/health", "/ping", "/version", "/metrics"):
        assert _call(root + path)[0] == 200, path
    with openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError) as err:
            c.models.list()
        assert err.value.body["message"] == "wrong API key in the `Authorization` header"
    for key in (KEY, OTHER_KEY):
        with openai.OpenAI(base_url=url, api_key=key, max_retries=0) as c:
            assert [m.id for m in c.models.list().data]
            r = c.chat.completions.create(**chat, temperature=0)
            assert r.choices[0].message.content and r.usage.completion_tokens >= 1
    assert _call(root + "/tokenize", {"prompt": "a"}, {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert_no_leaks(http[0])


def test_api_key_guards_grpc_generate(http, guarded):
    """pdserve.v1.Gateway needs `authorization: Bearer <key>` metadata (UNAUTHENTICATED naming
    it); pdserve.client.Client(api_key=...) sends it; grpc.health.v1 stays open."""
    import grpc

    from pdserve.healthcheck import check

    address, _ = guarded
    assert check(address, "pdserve.v1.Gateway")
    for key, words in ((None, "missing API key"), ("wrong", "wrong API key")):
        with Client(address, api_key=key) as c, pytest.raises(grpc.RpcError) as err:
            c.generate(text="Hi", max_tokens=2)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert words in err.value.details() and "`authorization` metadata" in err.value.details()
    with Client(address, api_key=OTHER_KEY) as c:
        text, ids, done = c.generate(text="The capital of France is", max_tokens=4, temperature=0.0, ignore_eos=True)
    assert len(ids) == 4 and done.usage.completion_tokens == 4
    assert_no_leaks(http[0])


def test_cors_only_where_origins_are_allowed(http, guarded):
    """--allowed-origins: a preflight is answered without a key and the answers (a 401, a stream)
    carry Access-Control-Allow-Origin; a gateway without the flag sends no CORS headers."""
    url = guarded[1]
    asked = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = _call(url + "/chat/completions", headers=asked, method="OPTIONS")
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in headers["Access-Control-Allow-Methods"] and "authorization" in headers["Access-Control-Allow-Headers"]
    assert _call(url + "/chat/completions", headers={**asked, "Origin": "https://evil.example"}, method="OPTIONS")[0] == 400
    body = {"model": "", "prompt": "Hi", "max_tokens": 2, "stream": True}
    status, headers, _ = _call(url + "/completions", body, {"Origin": ORIGIN})
    assert status == 401 and headers["Access-Control-Allow-Origin"] == ORIGIN
    status, headers, raw = _call(url + "/completions", body, {"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN and raw.endswith(b"data: [DONE]\n\n")
    plain = _call(http[1] + "/completions", {**body, "stream": False}, {"Origin": ORIGIN})
    assert plain[0] == 200 and not any(h.lower().startswith("access-control-") for h in plain[1])
    assert_no_leaks(http[0])
