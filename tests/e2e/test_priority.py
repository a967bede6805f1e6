"""Per-request scheduling and defaults through real processes: a colocated worker that runs one
sequence at a time serves the waiting requests lowest priority value first, whatever order they
came in (on the OpenAI face a bad priority is refused naming the field); the gateway fills a
request's unset sampling fields from a generation_config.json (vLLM's --generation-config)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from pdserve.client import Client, build_request
from pdserve.launch import Stack, free_port
from pdtest.stack import assert_no_leaks, pool_stats

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(default_model_dir, tmp_path_factory):
    """(stack, http port): a colocated worker of one sequence at a time, and a gateway whose
    sampling defaults come from a generation_config.json of its own (--generation-config FOLDER)."""
    folder = tmp_path_factory.mktemp("generation")
    (folder / "generation_config.json").write_text(json.dumps(DEFAULTS))
    port = free_port()
    with Stack(model=str(default_model_dir), colocated=True,
               worker_args=["--max-model-len", "512", "--max-num-seqs", "1"],
               gateway_args=["--max-model-len", "512", "--http-port", str(port),
                             "--generation-config", str(folder)]) as st:
        yield st, port


DEFAULTS = {"temperature": 0.0, "top_k": 0, "max_new_tokens": 5, "do_sample": True}


def test_waiting_requests_are_served_by_priority(served):
    st, port = served
    first_token: dict[str, float] = {}

    def ask(name: str, priority: int, max_tokens: int) -> None:
        req = build_request(text=f"Request {name}: count to ten.", max_tokens=max_tokens, temperature=0.0,
                            ignore_eos=True, priority=priority)
        with Client(st.gateway) as c:
            for msg in c.stream(req, timeout=120):
                if msg.HasField("chunk") and msg.chunk.token_ids:
                    first_token.setdefault(name, time.monotonic())

    long = threading.Thread(target=ask, args=("long", 0, 160))
    long.start()
    deadline = time.monotonic() + 60
    while "long" not in first_token and time.monotonic() < deadline:
        time.sleep(0.01)
    waiting = [threading.Thread(target=ask, args=("late", 7, 4)), threading.Thread(target=ask, args=("normal", 0, 4)),
               threading.Thread(target=ask, args=("urgent", -3, 4)), threading.Thread(target=ask, args=("soon", -1, 4))]
    for t in waiting:
        t.start()
        time.sleep(0.2)  # each reaches the worker before the next
    assert pool_stats(st.workers["colocated"], "colocated").waiting == 4, "they must all wait behind long"
    for t in [long, *waiting]:
        t.join(timeout=180)
    assert sorted(first_token, key=first_token.get) == ["long", "urgent", "soon", "normal", "late"]
    with Client(st.gateway) as c:  # the int32 range's ends pass
        assert c.generate(text="x", max_tokens=1, priority=2**31 - 1, temperature=0.0)[2].usage.completion_tokens == 1
        assert c.generate(text="x", max_tokens=1, priority=-(2**31), temperature=0.0)[2].usage.completion_tokens == 1
    bad = {"prompt": "x", "max_tokens": 1, "priority": "high"}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(bad).encode(),
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(req, timeout=30)
    assert http_err.value.code == 400 and json.loads(http_err.value.read())["error"]["param"] == "priority"
    assert_no_leaks(st)


def test_the_model_sampling_defaults_fill_unset_fields(served):
    """--generation-config: a request without temperature or max_tokens samples greedily (the
    file's temperature 0) and stops at 5 tokens (its max_new_tokens; 16 would be the built-in);
    fields a request sets win; a chat's unset max_tokens is the rest of the context capped by it."""
    st, port = served
    with Client(st.gateway) as c:
        text, ids, done = c.generate(text="The capital of France is")
        greedy = c.generate(text="The capital of France is", temperature=0.0, max_tokens=5)
        assert done.usage.completion_tokens == 5 and (text, ids) == greedy[:2]
        assert c.generate(text="The capital of France is", max_tokens=9, ignore_eos=True)[2].usage.completion_tokens == 9
        sampled = {tuple(c.generate(text="Once upon a time", temperature=1.0, seed=s, max_tokens=5)[1]) for s in range(4)}
        assert len(sampled) > 1  # a request's own temperature wins over the file's 0
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}], "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["usage"]["completion_tokens"] == 5


def test_requests_waiting_for_decode_room_go_by_priority(default_model_dir):
    """Disaggregated: while a decode pool has no room, requests wait at the gateway, and the one
    of the lowest priority value takes the room first. The pool (8 blocks of 16 tokens) is the long
    request's (100 + 24 tokens) until it ends, and then room for one of the two waiting ones (70
    tokens: 5 blocks each)."""
    from gateway.tokenizer import load_tokenizer

    words = load_tokenizer(default_model_dir).encode(" ".join(f"word{i}" for i in range(200)), add_special_tokens=False)
    with Stack(model=str(default_model_dir), worker_args=["--max-model-len", "512"], gateway_args=["--max-model-len", "512"],
               decode_args=["--num-blocks", "8"]) as st:
        first_token: dict[str, float] = {}

        def ask(name: str, prompt: list[int], priority: int, max_tokens: int) -> None:
            req = build_request(token_ids=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                priority=priority)
            with Client(st.gateway) as c:
                for msg in c.stream(req, timeout=120):
                    if msg.HasField("chunk") and msg.chunk.token_ids:
                        first_token.setdefault(name, time.monotonic())

        long = threading.Thread(target=ask, args=("long", words[:100], 0, 24))
        long.start()
        deadline = time.monotonic() + 60
        while "long" not in first_token and time.monotonic() < deadline:
            time.sleep(0.01)
        waiting = [threading.Thread(target=ask, args=("late", words[100:170], 4, 8)),
                   threading.Thread(target=ask, args=("urgent", words[170:240], -4, 8))]
        for t in waiting:
            t.start()
            time.sleep(0.3)
        assert not {"late", "urgent"} & set(first_token), "both must wait for the long request's room"
        for t in [long, *waiting]:
            t.join(timeout=180)
        assert sorted(first_token, key=first_token.get) == ["long", "urgent", "late"]
        assert_no_leaks(st)
