"""Request priority through real processes: a colocated worker that runs one sequence at a time
serves the waiting requests lowest priority value first, whatever order they came in; on the
OpenAI face a bad priority is refused naming the field."""

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


def test_waiting_requests_are_served_by_priority(default_model_dir):
    port = free_port()
    with Stack(model=str(default_model_dir), colocated=True,
               worker_args=["--max-model-len", "512", "--max-num-seqs", "1"],
               gateway_args=["--max-model-len", "512", "--http-port", str(port)]) as st:
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
