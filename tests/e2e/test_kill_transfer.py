"""kill -9 a worker while a KV transfer is really in flight (real processes; KV over tcp, and
over nccl with gloo on CPU as a `slow` variant).

Every KV chunk is held back on the prefill side (its transport thread) by the hidden debug knob
PDSERVE_DEBUG_KV_CHUNK_DELAY_MS (pdserve/transfer/_debug.py), so the chunks not yet sent exist
only in the prefill process; the knob also logs each chunk the decode worker applies: a test
waits until the decode side applied a few layers of the request, checks from the same log that
the transfer has not completed, and only then kills. The killed worker is restarted on its
port afterwards and the next request must be served; the surviving workers must not leak.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import Future

import grpc
import pytest

from pdserve.client import Client
from pdserve.launch import Proc, Stack
from pdserve.core.sampling import SamplingParams
from pdserve.proto import worker_pb2, worker_pb2_grpc
from pdserve.serving import sampling_to_wire
from pdserve.transfer._debug import ENV as DEBUG_ENV
from pdtest.stack import assert_no_leaks, pool_stats

LEASE_S = 2.0
REAPER_S = 0.25  # decode_service.server.lease_reaper period
CHUNK_DELAY_MS = 80  # SmolLM2 has 30 layers: a transfer takes >= 2.4 s
WORKER = ["--max-model-len", "512", "--num-blocks", "256"]
APPLIED = re.compile(r"kv-debug applied request=(\S+) layer=(\d+)")


@pytest.fixture(scope="module", params=["tcp", pytest.param("nccl", marks=pytest.mark.slow)])
def stack(request, default_model_dir):
    """gateway + 1 prefill + 1 decode; KV over tcp, or nccl (gloo on CPU, marked slow)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(DEBUG_ENV, str(CHUNK_DELAY_MS))  # read by every spawned worker, restarts too
        with Stack(model=str(default_model_dir), worker_args=[*WORKER, "--kv-transfer", request.param],
                   gateway_args=["--max-model-len", "512"],
                   decode_args=["--lease-ms", str(int(LEASE_S * 1000))]) as st:
            yield st


def _in_flight(proc: Proc, since: int, min_layer: int = 2, timeout: float = 60.0) -> str:
    """Wait until `proc` (the decode worker) logged, after its line `since`, that it applied
    layer >= min_layer of a request whose transfer has not completed; return that request id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in proc.lines[since:]:
            m = APPLIED.search(line)
            if m and int(m.group(2)) >= min_layer:
                rid = m.group(1)
                assert not _completed(proc, rid), "transfer completed before the kill"
                return rid
        time.sleep(0.01)
    raise AssertionError(f"no transfer in flight on {proc.name}:\n{''.join(proc.lines[-20:])}")


def _completed(proc: Proc, rid: str) -> bool:
    return any(f"kv-debug complete request={rid} " in line for line in list(proc.lines))


def _kill(proc: Proc) -> float:
    os.kill(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait(10)
    return time.monotonic()


def _restart(stack: Stack, name: str) -> None:
    """Start `name` again on its old port with its old arguments (as a supervisor would)."""
    old = stack.procs[name]
    module, extra = ("prefill_service", stack.prefill_args) if name == "prefill" else \
        ("decode_service", stack.decode_args)
    port = int(old.address.rsplit(":", 1)[1])
    stack.wait([stack.spawn(name, module, [*stack.worker_args, *extra], port=port)], 120)


def _generate_in_thread(address: str, text: str) -> Future:
    done: Future = Future()

    def run() -> None:
        try:
            with Client(address) as c:
                done.set_result(c.generate(text=text, max_tokens=4, temperature=0.0, timeout=60))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            done.set_exception(e)

    threading.Thread(target=run, daemon=True).start()
    return done


def _serves_next_request(stack: Stack, within_s: float = 10.0) -> None:
    """The next request is served once the gateway's health monitor (0.5 s period, reconnect
    backoff <= 1 s) has seen the restarted worker; until then it may answer UNAVAILABLE."""
    deadline = time.monotonic() + within_s
    with Client(stack.gateway) as c:
        while True:
            try:
                _, ids, complete = c.generate(text="The capital of France is", max_tokens=4,
                                              temperature=0.0, ignore_eos=True, timeout=60)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    assert len(ids) == 4 and complete.usage.completion_tokens == 4


def _renew(address: str, rid: str, stop: threading.Event) -> None:
    with grpc.insecure_channel(address) as ch:
        stub = worker_pb2_grpc.DecodeWorkerStub(ch)
        while not stop.wait(LEASE_S / 4):
            stub.Renew(worker_pb2.RenewRequest(request_id=rid), timeout=5)


def _wait_free(address: str, role: str, timeout: float) -> float:
    """Seconds until the worker's pool is all free with nothing reserved, running or waiting."""
    t0 = time.monotonic()
    while True:
        s = pool_stats(address, role)
        if s.free_blocks == s.total_blocks and s.running == 0 and s.waiting == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{role}: free {s.free_blocks}/{s.total_blocks}, "
                                 f"running {s.running}, waiting {s.waiting}")
        time.sleep(0.02)


def test_prefill_killed_mid_transfer_lease_frees_reservation(stack):
    """No gateway in the path (nobody sends Abort): only the decode worker's lease can free it."""
    decode, prefill = stack.procs["decode"], stack.procs["prefill"]
    rid, prompt = "lease-test-1", list(range(100, 140))
    with grpc.insecure_channel(decode.address) as dch, grpc.insecure_channel(prefill.address) as pch:
        target = worker_pb2_grpc.DecodeWorkerStub(dch).Reserve(
            worker_pb2.ReserveRequest(request_id=rid, num_tokens=len(prompt)), timeout=10)
        since = len(decode.lines)
        call = worker_pb2_grpc.PrefillWorkerStub(pch).Prefill.future(worker_pb2.PrefillRequest(
            request_id=rid, prompt_token_ids=prompt, target=target,
            sampling=sampling_to_wire(SamplingParams(max_tokens=4))), timeout=60)
        # Renew while the prefill runs, as the gateway does; the renewals stop with the kill.
        stop_renewing = threading.Event()
        threading.Thread(target=_renew, args=(decode.address, rid, stop_renewing), daemon=True).start()
        assert _in_flight(decode, since) == rid
        stop_renewing.set()
        killed_at = _kill(prefill)
        with pytest.raises(grpc.RpcError) as err:
            call.result(timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert pool_stats(decode.address, "decode").waiting == 1  # still reserved: no Abort came
    freed_after = _wait_free(decode.address, "decode", LEASE_S + 5)
    assert time.monotonic() - killed_at <= LEASE_S + 2 * REAPER_S, freed_after
    assert any("freed 1 expired KV reservations" in line for line in decode.lines)
    assert not _completed(decode, rid)
    _restart(stack, "prefill")
    _serves_next_request(stack)
    assert_no_leaks(stack)


def test_prefill_killed_mid_transfer_client_sees_unavailable(stack):
    decode, prefill = stack.procs["decode"], stack.procs["prefill"]
    since = len(decode.lines)
    pending = _generate_in_thread(stack.gateway, "Tell me about the sea.")
    rid = _in_flight(decode, since)
    killed_at = _kill(prefill)
    with pytest.raises(grpc.RpcError) as err:
        pending.result(timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    _wait_free(decode.address, "decode", LEASE_S + 5)
    assert time.monotonic() - killed_at <= LEASE_S + 2 * REAPER_S
    assert not _completed(decode, rid)
    _restart(stack, "prefill")
    _serves_next_request(stack)
    assert_no_leaks(stack)


def test_decode_killed_mid_receive_prefill_frees_everything(stack):
    decode, prefill = stack.procs["decode"], stack.procs["prefill"]
    since = len(decode.lines)
    pending = _generate_in_thread(stack.gateway, "Write a poem about trees.")
    rid = _in_flight(decode, since)
    _kill(decode)
    with pytest.raises(grpc.RpcError) as err:
        pending.result(timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not _completed(decode, rid)
    assert any(f"request={rid}" in line for line in prefill.lines if "kv-debug sent" in line)
    _wait_free(prefill.address, "prefill", 10)  # free == total, nothing running or waiting
    _restart(stack, "decode")
    _serves_next_request(stack)
    assert_no_leaks(stack)
