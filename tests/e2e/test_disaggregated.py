"""Three real processes (gateway, prefill, decode; KV over tcp) against the single-process engine."""

from __future__ import annotations

import random

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pdserve.client import build_request
from pdserve.core.sampling import SamplingParams
from pdserve.proto import gateway_pb2
from pdserve.runtime.offline import generate
from pdtest.logprobs import check_prompt_logprobs, offline_prompt_logprobs

pytestmark = pytest.mark.slow


def offline(runner, prompt: list[int], max_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    return generate(runner, [prompt], params, runner.spec.eos_token_ids)[0]


def test_capital_of_france(client):
    text, ids, done = client.generate(messages=[("user", "What is the capital of France?")],
                                      max_tokens=48, temperature=0.0)
    assert "Paris" in text
    assert done.finish_reason == gateway_pb2.FINISH_REASON_STOP
    assert done.usage.completion_tokens == len(ids) and done.usage.prompt_tokens > 10


@pytest.mark.parametrize("prompt", ["The quick brown fox", "def fibonacci(n):", "Once upon a time, in a land"])
def test_greedy_equals_single_process_engine(client, offline_runner, prompt):
    tok_ids = client.generate(text=prompt, max_tokens=1, temperature=0.0)[1]
    assert len(tok_ids) == 1
    from gateway.tokenizer import load_tokenizer

    text, ids, done = client.generate(text=prompt, max_tokens=40, temperature=0.0, ignore_eos=True)
    assert done.usage.completion_tokens == 40
    prompt_ids = load_tokenizer(offline_runner_dir(offline_runner)).encode(prompt)
    assert ids == offline(offline_runner, prompt_ids, 40)


def offline_runner_dir(runner):
    from pdserve.model.prepare import ensure_default_model

    return ensure_default_model(progress=False)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 300])
def test_paged_kv_edges(client, offline_runner, n):
    rng = random.Random(n)
    prompt = [rng.randrange(100, 40000) for _ in range(n)]
    _, ids, done = client.generate(token_ids=prompt, max_tokens=20, temperature=0.0, ignore_eos=True)
    assert done.usage.prompt_tokens == n
    assert ids == offline(offline_runner, prompt, 20)


def test_max_tokens_and_length_finish(client):
    _, ids, done = client.generate(text="Count: one, two,", max_tokens=5, temperature=0.0, ignore_eos=True)
    assert len(ids) == 5 and done.finish_reason == gateway_pb2.FINISH_REASON_LENGTH


def test_max_tokens_one_finishes_at_prefill(client):
    _, ids, done = client.generate(text="Hello", max_tokens=1, temperature=0.0)
    assert len(ids) == 1 and done.finish_reason == gateway_pb2.FINISH_REASON_LENGTH


def test_stop_string_cuts_text(client):
    full, _, _ = client.generate(text="List: 1, 2, 3, 4, 5, 6, 7,", max_tokens=30, temperature=0.0, ignore_eos=True)
    stop = full.strip()[4:7]
    assert stop
    text, _, done = client.generate(text="List: 1, 2, 3, 4, 5, 6, 7,", max_tokens=30, temperature=0.0,
                                    ignore_eos=True, stop=[stop])
    assert stop not in text and full.startswith(text)
    assert done.finish_reason == gateway_pb2.FINISH_REASON_STOP and done.stop_string == stop


def test_seeded_sampling_is_reproducible(client):
    kw = dict(text="Write a word:", max_tokens=24, temperature=1.0, top_p=0.95, ignore_eos=True)
    a = client.generate(seed=1234, **kw)[1]
    b = client.generate(seed=1234, **kw)[1]
    c = client.generate(seed=99, **kw)[1]
    assert a == b and a != c


def test_health_and_reflection(stack):
    for proc in stack.procs.values():
        with grpc.insecure_channel(proc.address) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(stack.gateway) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        names = [s.name for r in stub.ServerReflectionInfo(iter([req])) for s in r.list_services_response.service]
    assert "pdserve.v1.Gateway" in names


def test_client_cancel_frees_blocks(stack, client):
    call = client.stream(__import__("pdserve.client", fromlist=["build_request"]).build_request(
        text="Tell me a long story", max_tokens=400, temperature=0.0, ignore_eos=True))
    for i, _ in enumerate(call):
        if i == 3:
            call.cancel()
            break
    # the client fixture's leak check runs at teardown


def test_reservation_lease_expires_unless_renewed(stack):
    import time

    from pdserve.proto import worker_pb2, worker_pb2_grpc
    from pdtest.stack import pool_stats

    address = stack.procs["decode"].address
    total = pool_stats(address, "decode").total_blocks
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.DecodeWorkerStub(ch)
        target = stub.Reserve(worker_pb2.ReserveRequest(request_id="lease-a", num_tokens=40), timeout=5)
        assert len(target.block_ids) == 3 and target.lease_ms == 2000
        assert pool_stats(address, "decode").free_blocks == total - 3
        for _ in range(3):  # 3 s of renewals keep a 2 s lease alive
            time.sleep(1.0)
            assert stub.Renew(worker_pb2.RenewRequest(request_id="lease-a"), timeout=5).found
        assert pool_stats(address, "decode").free_blocks == total - 3
        deadline = time.monotonic() + 4.0  # no renewal: freed within the lease (+ reaper period)
        while pool_stats(address, "decode").free_blocks != total:
            assert time.monotonic() < deadline, "reservation not freed after its lease"
            time.sleep(0.1)
        assert not stub.Renew(worker_pb2.RenewRequest(request_id="lease-a"), timeout=5).found


def test_subscribe_stream_errors_and_close_aborts(stack):
    """The decode worker's multiplexed token stream: bad ids are refused naming the field, the
    first message says the stream is registered, tokens carry their request id, and a closed
    stream aborts its requests (no block leaks)."""
    from pdserve.proto import worker_pb2, worker_pb2_grpc
    from pdserve.serving import sampling_to_wire
    from pdtest.stack import assert_no_leaks

    sampling = sampling_to_wire(SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True))
    with grpc.insecure_channel(stack.procs["decode"].address) as ch:
        stub = worker_pb2_grpc.DecodeWorkerStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            next(stub.Subscribe(worker_pb2.SubscribeRequest(subscriber_id=""), timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "subscriber_id" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            stub.StartGenerate(worker_pb2.GenerateWork(request_id="m1", prompt_token_ids=[1, 2, 3],
                                                       sampling=sampling, subscriber_id="nobody"), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "subscriber_id" in err.value.details()
        call = stub.Subscribe(worker_pb2.SubscribeRequest(subscriber_id="s1"), timeout=60)
        assert not next(call).batches  # registered
        with pytest.raises(grpc.RpcError) as err:
            next(stub.Subscribe(worker_pb2.SubscribeRequest(subscriber_id="s1"), timeout=10))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        for rid in ("m1", "m2"):
            stub.StartGenerate(worker_pb2.GenerateWork(request_id=rid, prompt_token_ids=[1, 2, 3],
                                                       sampling=sampling, subscriber_id="s1"), timeout=10)
        seen: dict[str, int] = {}
        while min(seen.get("m1", 0), seen.get("m2", 0)) < 3:
            for batch in next(call).batches:
                assert batch.finish == worker_pb2.WORKER_FINISH_NONE
                seen[batch.request_id] = seen.get(batch.request_id, 0) + len(batch.token_ids)
        assert set(seen) == {"m1", "m2"}
        call.cancel()  # the gateway went away mid-generation
    assert_no_leaks(stack)


def offline_logprobs(runner, prompt: list[int], tokens: list[int], k: int) -> list:
    """The single-process engine's greedy logprobs for each of tokens after prompt (one prefill
    per position)."""
    from pdserve.core.step_io import SeqSlice, StepInput

    params = SamplingParams(temperature=0.0, logprobs=k)
    out = []
    for i in range(len(tokens)):
        ids = tuple(prompt + tokens[:i])
        step = runner.execute(StepInput((SeqSlice("lp", ids, 0, tuple(range(-(-len(ids) // 16))), params),)))
        assert step.sampled["lp"] == tokens[i]
        out.append(step.logprobs["lp"])
    return out


def test_logprobs_equal_single_process_engine(client, offline_runner):
    """logprobs=3 through gateway, prefill (first token) and decode workers: one entry per token,
    in the chunks that carry the tokens, equal to the single-process engine's."""
    prompt = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    chunks = [m.chunk for m in client.stream(build_request(token_ids=prompt, max_tokens=6, temperature=0.0,
                                                           ignore_eos=True, logprobs=3), timeout=60)
              if m.HasField("chunk")]
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
    ids = [t for c in chunks for t in c.token_ids]
    got = [lp for c in chunks for lp in c.logprobs]
    assert len(ids) == 6
    for lp, want in zip(got, offline_logprobs(offline_runner, prompt, ids, 3)):
        assert lp.logprob == pytest.approx(want.logprob, abs=1e-4)
        assert list(lp.top_token_ids) == [t for t, _ in want.top]
        assert list(lp.top_logprobs) == pytest.approx([v for _, v in want.top], abs=1e-4)
    plain = [m.chunk for m in client.stream(build_request(token_ids=prompt, max_tokens=2, temperature=0.0),
                                            timeout=60) if m.HasField("chunk")]
    assert not any(c.logprobs for c in plain)


def test_prompt_logprobs_equal_single_process_engine(client, offline_runner):
    """prompt_logprobs=2 through the prefill worker (twice: the second time its prefix cache
    holds the prompt, which such a request must not use) equal the single-process engine's;
    the generated tokens are unchanged; 21 is refused naming the field."""
    prompt = [504, 3575, 282, 4649, 314, 7042, 30, 504, 3575, 282, 4649, 314, 2114, 28, 253, 1342, 17, 33, 3049]
    want = offline_prompt_logprobs(offline_runner, prompt, 2)
    plain = offline(offline_runner, prompt, 3)
    for _ in range(2):
        chunks = [m.chunk for m in client.stream(build_request(token_ids=prompt, max_tokens=3, temperature=0.0,
                                                               prompt_logprobs=2), timeout=60) if m.HasField("chunk")]
        check_prompt_logprobs(chunks, prompt, want, 2)
        assert [t for c in chunks for t in c.token_ids] == plain
    with pytest.raises(grpc.RpcError) as err:
        client.generate(token_ids=prompt, max_tokens=1, prompt_logprobs=21)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_logprobs" in err.value.details()


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.3),
                                       dict(frequency_penalty=1.5, presence_penalty=0.5)])
def test_penalties_equal_single_process_engine(client, offline_runner, penalties):
    """Penalized greedy tokens through the workers (the prefill worker's first token counts the
    prompt alone; the decode worker counts the first token too) equal the single-process
    engine's, and differ from unpenalized ones on a repetitive prompt."""
    prompt = [504, 3575, 282, 4649, 314, 7042, 30, 504, 3575, 282, 4649, 314]
    _, got, _ = client.generate(token_ids=prompt, max_tokens=24, temperature=0.0, ignore_eos=True, **penalties)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **penalties)
    assert got == generate(offline_runner, [prompt], params)[0]
    assert got != offline(offline_runner, prompt, 24)


def test_cli_generate_prints_logprobs_and_takes_penalties(stack, capsys):
    """`pdserve generate --logprobs 2` prints a line per token (id, logprob, two alternatives, the
    first the token itself under greedy: logprobs are the raw model's, so not with a penalty on);
    a penalty reaches the gateway, which refuses a bad one naming the field."""
    from pdserve.cli import main

    main(["generate", "--address", stack.gateway, "--max-tokens", "4", "--logprobs", "2", "The capital of France is"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split("\t") for line in lines[-4:]]
    assert "[finish=length" in lines[-5] and all(len(r) == 3 for r in rows)
    for token, logprob, top in rows:
        alternatives = [t.split(":") for t in top.split(" ")]
        assert len(alternatives) == 2 and alternatives[0][0] == token and float(logprob) <= 0
    with pytest.raises(SystemExit, match="INVALID_ARGUMENT: presence_penalty"):
        main(["generate", "--address", stack.gateway, "--presence-penalty", "5", "hi"])
    main(["generate", "--address", stack.gateway, "--max-tokens", "1", "--prompt-logprobs", "1", "The capital of France is"])
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines() if line.startswith("prompt\t")]
    assert len(rows) == 4 and all(len(r) == 4 and float(r[2]) <= 0 and ":" in r[3] for r in rows)  # 5 prompt tokens
    main(["generate", "--address", stack.gateway, "--max-tokens", "2", "--priority", "-5", "hi"])
    assert "[finish=length prompt_tokens=" in capsys.readouterr().out
