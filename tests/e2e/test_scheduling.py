"""Scheduling through real processes with the default model on CPU: concurrency, prefix caching,
decode-side preemption, colocated mode. Greedy tokens are compared with the single-process
engine running each prompt alone; every test ends with the leak check."""

from __future__ import annotations

import asyncio
import random
import time

import grpc
import pytest

from pdserve.client import AsyncClient, Client, build_request
from pdserve.core.sampling import SamplingParams
from pdserve.launch import Stack
from pdserve.runtime.offline import generate
from pdtest.stack import assert_no_leaks, pool_stats

pytestmark = pytest.mark.slow

WORKER = ["--max-model-len", "512", "--num-blocks", "400"]
GATEWAY = ["--max-model-len", "512"]
# 32 prompts queued on one CPU prefill worker wait far longer than this lease: the gateway's
# renewals must keep their reservations alive.
LEASE = ["--lease-ms", "2000"]
TEXT = ("The history of the city begins with a small fishing village on the river bank. Over the "
        "centuries merchants, scholars and craftsmen arrived from every direction, bringing new "
        "languages, foods and ideas. Bridges were built, markets grew, and the old walls were "
        "replaced by wide avenues lined with trees. Today the city is known for its museums, its "
        "music and its long summer evenings, when people gather by the water to talk and eat. ") * 4


@pytest.fixture(scope="module")
def text_ids(default_model_dir) -> list[int]:
    from gateway.tokenizer import load_tokenizer

    return load_tokenizer(default_model_dir).encode(TEXT)


@pytest.fixture(scope="module")
def disagg(default_model_dir):
    with Stack(model=str(default_model_dir), worker_args=WORKER, gateway_args=GATEWAY, decode_args=LEASE) as st:
        yield st


def mixed(ids: list[int], n: int) -> list[tuple[list[int], int]]:
    """n (prompt, max_tokens) pairs of mixed lengths (3-92 tokens: 1-6 blocks, most with a partial
    last one) cut from different places of ids."""
    return [(ids[(7 * i) % 60 : (7 * i) % 60 + 3 + (37 * i) % 90], 4 + (5 * i) % 17) for i in range(n)]


def alone(runner, prompt: list[int], max_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return generate(runner, [prompt], params, runner.spec.eos_token_ids)[0]


async def _one(client: AsyncClient, prompt: list[int], max_tokens: int, retry_s: float) -> list[int]:
    deadline = time.monotonic() + retry_s
    while True:
        try:
            _, ids, _ = await client.generate(token_ids=prompt, max_tokens=max_tokens, temperature=0.0,
                                              ignore_eos=True, timeout=120)
            return ids
        except grpc.aio.AioRpcError as e:  # a full decode pool refuses Reserve: come back later
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def concurrently(address: str, work: list[tuple[list[int], int]], retry_s: float = 0.0) -> list[list[int]]:
    """Greedy tokens of every (prompt, max_tokens), all requests in flight at once."""

    async def main() -> list[list[int]]:
        client = AsyncClient(address)
        try:
            return list(await asyncio.gather(*(_one(client, p, m, retry_s) for p, m in work)))
        finally:
            await client.close()

    return asyncio.run(main())


def test_32_concurrent_mixed_requests_equal_solo_greedy(disagg, offline_runner, text_ids):
    work = mixed(text_ids, 32)
    got = concurrently(disagg.gateway, work)
    for (prompt, m), ids in zip(work, got):
        assert ids == alone(offline_runner, prompt, m), f"prompt of {len(prompt)} tokens"
    assert_no_leaks(disagg)


def test_shared_prefix_is_computed_once(disagg, offline_runner, text_ids):
    prefix = random.Random(5).sample(range(1000, 30000), 200)  # seen by no earlier request
    hits = lambda: pool_stats(disagg.workers["prefill"], "prefill").prefix_cache_hits  # noqa: E731
    with Client(disagg.gateway) as client:
        h0 = hits()
        client.generate(token_ids=prefix + [504, 1011], max_tokens=2, temperature=0.0)
        h1 = hits()
        b = prefix + text_ids[:9]
        _, ids, _ = client.generate(token_ids=b, max_tokens=6, temperature=0.0, ignore_eos=True)
        h2 = hits()
    assert h1 == h0  # the first sighting computes everything
    assert h2 - h1 == (200 // 16) * 16  # the second computes only its tail
    assert ids == alone(offline_runner, b, 6)
    assert_no_leaks(disagg)


def test_small_decode_pool_preempts_and_keeps_tokens(default_model_dir, offline_runner, text_ids):
    # 12 blocks of 16 = 192 tokens: about 3 of these sequences (<= 64 tokens each) at once.
    work = [(text_ids[i * 9 : i * 9 + 30 + 2 * i], 24) for i in range(8)]
    with Stack(model=str(default_model_dir), worker_args=WORKER, gateway_args=GATEWAY,
               decode_args=[*LEASE, "--num-blocks", "12"]) as st:
        got = concurrently(st.gateway, work, retry_s=120)
        assert pool_stats(st.workers["decode"], "decode").preemptions > 0
        assert_no_leaks(st)
    for (prompt, m), ids in zip(work, got):
        assert ids == alone(offline_runner, prompt, m)


def test_colocated_equals_disaggregated(default_model_dir, disagg, text_ids):
    work = mixed(text_ids, 10) + [(text_ids[:300], 8)]  # 300 tokens: chunked over 64-token steps
    want = concurrently(disagg.gateway, work)
    with Stack(model=str(default_model_dir), worker_args=WORKER, gateway_args=GATEWAY, colocated=True,
               decode_args=["--max-num-batched-tokens", "64"]) as st:
        assert concurrently(st.gateway, work) == want
        with Client(st.gateway) as client:  # a client cancel frees the colocated worker's blocks
            call = client.stream(build_request(token_ids=text_ids[:50], max_tokens=24, temperature=0.0,
                                               ignore_eos=True))
            for i, _ in enumerate(call):
                if i == 2:
                    call.cancel()
                    break
        assert pool_stats(st.workers["colocated"], "colocated").role == "colocated"
        assert_no_leaks(st)
    assert_no_leaks(disagg)
