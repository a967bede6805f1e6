"""Speculative decoding in the serving decode worker (real processes, default model): n-gram
lookup, and a draft model (the default model drafting for itself).

Greedy tokens with --speculative-config equal the single-process engine's plain greedy tokens,
on prompts that repeat text (so drafts get accepted), with fewer decode steps than tokens;
stop tokens and max_tokens are honoured; GetStats and Prometheus report acceptance; a bad
config or a draft model with another vocabulary stops the worker at startup, naming why.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from pdserve.core.sampling import SamplingParams
from pdserve.launch import Stack, free_port
from pdserve.proto import gateway_pb2
from pdserve.runtime.offline import generate
from pdtest.logprobs import check_prompt_logprobs, offline_prompt_logprobs
from pdtest.stack import assert_no_leaks, pool_stats

pytestmark = pytest.mark.slow

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                   "prompt_lookup_min": 1})
PROMPT = ("Repeat the list.\nList: apples, bananas, cherries, dates, elderberries, figs, grapes.\n"
          "Repeat: apples, bananas, cherries, dates, elderberries, figs, grapes.\n"
          "List: red, orange, yellow, green, blue, indigo, violet.\nRepeat:")
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def reference(offline_runner, default_model_dir) -> tuple[list[int], list[int]]:
    """Prompt ids and the single-process engine's plain greedy tokens (no speculation)."""
    from gateway.tokenizer import load_tokenizer

    ids = load_tokenizer(default_model_dir).encode(PROMPT)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return ids, generate(offline_runner, [ids], params)[0]


def spec_stack(model_dir, colocated: bool, metrics_port: int = 0, spec: str = SPEC) -> Stack:
    decode = ["--speculative-config", spec, "--lease-ms", "5000"]
    if metrics_port:
        decode += ["--metrics-port", str(metrics_port)]
    return Stack(model=str(model_dir), worker_args=["--max-model-len", "512"],
                 gateway_args=["--max-model-len", "512"], decode_args=decode, colocated=colocated)


def check_greedy_run(stack: Stack, role: str, reference) -> None:
    """One greedy request: same tokens as plain decoding, drafts accepted, fewer steps than tokens."""
    from pdserve.client import Client

    ids, want = reference
    before = pool_stats(stack.workers[role], role)
    with Client(stack.gateway) as c:
        _, got, done = c.generate(token_ids=ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    after = pool_stats(stack.workers[role], role)
    assert got == want
    assert done.finish_reason == gateway_pb2.FINISH_REASON_LENGTH
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    steps = after.engine_steps - before.engine_steps  # colocated: the prefill step included
    assert accepted > 0, after
    assert steps < MAX_TOKENS - 1, (steps, accepted)
    assert after.spec_draft_tokens - before.spec_draft_tokens >= accepted
    assert sum(after.spec_accepted_per_pos) == after.spec_accepted_tokens


def test_disaggregated(default_model_dir, reference) -> None:
    port = free_port()
    with spec_stack(default_model_dir, colocated=False, metrics_port=port) as st:
        check_greedy_run(st, "decode", reference)
        ids, want = reference
        from pdserve.client import Client

        with Client(st.gateway) as c:
            # max_tokens in the middle of what drafts would cover
            _, got, done = c.generate(token_ids=ids, max_tokens=7, temperature=0.0, ignore_eos=True)
            assert got == want[:7] and done.finish_reason == gateway_pb2.FINISH_REASON_LENGTH
            # a stop token first emitted late in the repeating part (where drafts are accepted)
            j = max(i for i in range(1, len(want)) if want[i] not in want[:i])
            _, got, done = c.generate(token_ids=ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                                      stop_token_ids=[want[j]])
            assert got == want[: j + 1] and done.finish_reason == gateway_pb2.FINISH_REASON_STOP
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        stats = pool_stats(st.workers["decode"], "decode")
        assert f"pdserve:spec_decode_num_accepted_tokens_total {float(stats.spec_accepted_tokens)}" in text
        assert f"pdserve:spec_decode_num_draft_tokens_total {float(stats.spec_draft_tokens)}" in text
        assert 'pdserve:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
        assert "pdserve:spec_decode_num_drafts_total" in text
        assert_no_leaks(st)


def test_colocated(default_model_dir, reference, offline_runner) -> None:
    with spec_stack(default_model_dir, colocated=True) as st:
        check_greedy_run(st, "colocated", reference)
        check_logprobs_run(st, "colocated", reference)
        check_prompt_logprobs_run(st, reference, offline_runner)
        assert_no_leaks(st)


def check_prompt_logprobs_run(stack: Stack, reference, offline_runner) -> None:
    """Prompt logprobs from the colocated worker, sent beside a greedy request whose drafts its
    steps verify, equal the single-process engine's; both get the plain greedy tokens."""
    from pdserve.client import Client, build_request

    ids, want = reference
    expect = offline_prompt_logprobs(offline_runner, ids, 3)
    with Client(stack.gateway) as c, ThreadPoolExecutor(1) as pool:
        drafting = pool.submit(c.generate, token_ids=ids, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        chunks = [m.chunk for m in c.stream(build_request(token_ids=ids, max_tokens=MAX_TOKENS, temperature=0.0,
                                                          ignore_eos=True, prompt_logprobs=3), timeout=120)
                  if m.HasField("chunk")]
        assert drafting.result(timeout=120)[1] == want
    check_prompt_logprobs(chunks, ids, expect, 3)
    assert [t for ch in chunks for t in ch.token_ids] == want


def check_logprobs_run(stack: Stack, role: str, reference) -> None:
    """A request asking for logprobs is not speculated (verify steps report none): the same
    greedy tokens, each with its logprob (the top-1 alternative), no draft verified for it."""
    from pdserve.client import Client, build_request

    ids, want = reference
    before = pool_stats(stack.workers[role], role)
    with Client(stack.gateway) as c:
        chunks = [m.chunk for m in c.stream(build_request(token_ids=ids, max_tokens=MAX_TOKENS, temperature=0.0,
                                                          ignore_eos=True, logprobs=1), timeout=120)
                  if m.HasField("chunk")]
    after = pool_stats(stack.workers[role], role)
    got = [t for ch in chunks for t in ch.token_ids]
    logprobs = [lp for ch in chunks for lp in ch.logprobs]
    assert got == want and len(logprobs) == len(got)
    assert [lp.top_token_ids[0] for lp in logprobs] == got
    assert all(lp.logprob == lp.top_logprobs[0] <= 0 for lp in logprobs)
    assert after.spec_draft_tokens == before.spec_draft_tokens


def test_bad_config_refused_at_startup() -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "decode_service", "--port", str(free_port()),
           "--speculative-config", '{"num_speculative_tokenz": 4}']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--speculative-config" in out.stderr and "'num_speculative_tokenz'" in out.stderr, out.stderr


def test_draft_model_disaggregated(default_model_dir, reference) -> None:
    """The default model drafts for itself: every greedy draft is the target's own token."""
    draft = json.dumps({"model": str(default_model_dir), "num_speculative_tokens": 4})
    with spec_stack(default_model_dir, colocated=False, spec=draft) as st:
        check_greedy_run(st, "decode", reference)
        stats = pool_stats(st.workers["decode"], "decode")
        assert stats.spec_accepted_tokens >= 0.9 * stats.spec_draft_tokens, stats
        assert_no_leaks(st)


def test_draft_model_with_another_vocabulary_refused(default_model_dir, tmp_path) -> None:
    import subprocess
    import sys

    config = json.loads((default_model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 64}))
    cmd = [sys.executable, "-m", "decode_service", "--port", str(free_port()), "--model", str(default_model_dir),
           "--load-format", "dummy", "--speculative-config", json.dumps({"model": str(tmp_path)})]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "--speculative-config model" in out.stderr and "must share the tokenizer" in out.stderr, out.stderr[-2000:]
