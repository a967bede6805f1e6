"""`pdserve up` as a real process: SIGTERM (not only Ctrl-C) stops every service it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, int(port))) == 0


def test_sigterm_stops_every_service(tmp_path) -> None:
    """With --http-port the gateway's OpenAI face answers too (with the --reasoning-parser given to
    up), and goes with the rest."""
    from pdserve.launch import free_port

    port, http_port = free_port(), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", "from pdserve.cli import main; main()", "up", "--quiet", "--port", str(port),
                             "--http-port", str(http_port), "--reasoning-parser", "qwen3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    addresses, urls = [], []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            words = line.split()
            if len(words) == 2 and words[0] in ("prefill", "decode", "gateway", "colocated"):
                addresses.append(words[1])
            if len(words) == 2 and words[0] == "openai":
                urls.append(words[1])
            if line.startswith("serving on"):
                break
            assert time.monotonic() < deadline, "pdserve up did not come up"
        assert len(addresses) == 3 and all(_listening(a) for a in addresses), addresses
        assert urls == [f"http://127.0.0.1:{http_port}/v1"]
        with urllib.request.urlopen(urls[0] + "/models", timeout=30) as r:
            assert json.loads(r.read())["data"][0]["object"] == "model"
        city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
                "additionalProperties": False}
        ask = {"messages": [{"role": "user", "content": "What is the capital of France? Answer in JSON."},
                            {"role": "assistant", "content": "<think>"}], "max_tokens": 80, "temperature": 0,
               "add_generation_prompt": False, "continue_final_message": True, "guided_json": city,
               "logit_bias": {"9617": 6, "17400": 10, "46": 5}}  # as tests/e2e/test_openai_tools.py's OPENED
        with urllib.request.urlopen(urllib.request.Request(urls[0] + "/chat/completions", json.dumps(ask).encode(),
                                                           {"Content-Type": "application/json"}), timeout=60) as r:
            message = json.loads(r.read())["choices"][0]["message"]
        assert message["reasoning"] and isinstance(json.loads(message["content"]), dict), message
        addresses.append(f"127.0.0.1:{http_port}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) is not None
        end = time.monotonic() + 30
        while any(_listening(a) for a in addresses) and time.monotonic() < end:
            time.sleep(0.5)
        assert not any(_listening(a) for a in addresses), "a service outlived pdserve up"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
