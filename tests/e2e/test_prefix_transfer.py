"""Decode-side prefix cache through real processes (default model, CPU, KV over tcp): a request
sharing a cached prefix is computed AND transferred only past it; eviction keeps tokens right.

Greedy tokens are compared with the single-process engine running each prompt alone (no
cache). Both pools are small so that one long request evicts most cached blocks; the prefill
worker chunks prompts (64 tokens a step), so pushes that skip the decode side's prefix span
several steps. Every test ends with the leak check: evictable cached blocks count as free.
"""

from __future__ import annotations

import random
import urllib.request

import pytest

from pdserve.client import Client
from pdserve.core.sampling import SamplingParams
from pdserve.launch import Stack, free_port
from pdserve.runtime.offline import generate
from pdserve.transfer.base import layout_from_proto
from pdtest.stack import assert_no_leaks, pool_stats

pytestmark = pytest.mark.slow

BS = 16
WORKER = ["--max-model-len", "512", "--max-num-seqs", "4"]
PREFILL = ["--num-blocks", "20", "--max-num-batched-tokens", "64"]
DECODE = ["--num-blocks", "24", "--lease-ms", "5000"]
METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def stack(default_model_dir):
    with Stack(model=str(default_model_dir), worker_args=WORKER, gateway_args=["--max-model-len", "512"],
               prefill_args=PREFILL, decode_args=[*DECODE, "--metrics-port", str(METRICS_PORT)]) as st:
        yield st


class Meter:
    """Deltas of the prefix-cache and received-KV counters of both workers over one request."""

    def __init__(self, st: Stack) -> None:
        self.st = st
        self.before = self._read()

    def _read(self) -> tuple[int, int, int, int]:
        d = pool_stats(self.st.workers["decode"], "decode")
        p = pool_stats(self.st.workers["prefill"], "prefill")
        return d.prefix_cache_hits, p.prefix_cache_hits, d.kv_received_blocks, d.kv_received_bytes

    def generate(self, prompt: list[int], max_tokens: int) -> tuple[list[int], tuple[int, int, int, int]]:
        with Client(self.st.gateway) as client:
            _, ids, _ = client.generate(token_ids=prompt, max_tokens=max_tokens, temperature=0.0,
                                        ignore_eos=True, timeout=120)
        after = self._read()
        delta = tuple(a - b for a, b in zip(after, self.before))
        self.before = after
        return ids, delta  # (decode hits, prefill hits, received blocks, received bytes)


def alone(runner, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens of the single-process engine for prompt alone (the no-cache run)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return generate(runner, [prompt], params, runner.spec.eos_token_ids)[0]


def block_bytes(st: Stack) -> int:
    layout = layout_from_proto(pool_stats(st.workers["decode"], "decode").layout)
    return layout.num_layers * layout.block_size * layout.token_bytes_per_layer


def blocks(n: int) -> int:
    return -(-n // BS)


def test_shared_prefix_is_computed_and_transferred_once(stack, offline_runner):
    prefix = random.Random(11).sample(range(1000, 30000), 200)  # seen by no other request
    a, b = prefix + [504, 1011, 3], prefix + list(range(2000, 2009))
    bb, meter = block_bytes(stack), Meter(stack)
    ids_a, (dh, ph, nb, nbytes) = meter.generate(a, 3)
    assert (dh, ph) == (0, 0)  # the first sighting computes and sends everything
    assert (nb, nbytes) == (blocks(len(a)), blocks(len(a)) * bb)
    ids_b, (dh, ph, nb, nbytes) = meter.generate(b, 6)
    cached = (200 // BS) * BS
    assert (dh, ph) == (cached, cached)  # neither side recomputes nor receives the prefix
    tail = blocks(len(b)) - cached // BS
    assert (nb, nbytes) == (tail, tail * bb) and tail == 2
    assert ids_a == alone(offline_runner, a, 3)
    assert ids_b == alone(offline_runner, b, 6)
    d = pool_stats(stack.workers["decode"], "decode")
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
    assert f"pdserve:kv_received_blocks_total {float(d.kv_received_blocks)}" in text
    assert f"pdserve:prefix_cache_hits_total {float(d.prefix_cache_hits)}" in text
    assert_no_leaks(stack)


def test_eviction_under_small_pools_keeps_tokens(stack, offline_runner):
    rng = random.Random(12)
    q = rng.sample(range(1000, 30000), 200)
    c, e = q + [7, 8, 9], q + [10, 11, 12, 13]
    flood = rng.sample(range(1000, 30000), 300)  # 19 of the 24 decode / 20 prefill blocks
    bb, meter = block_bytes(stack), Meter(stack)
    ids_c, _ = meter.generate(c, 4)
    _, (dh, ph, nb, _) = meter.generate(flood, 2)
    assert (dh, ph, nb) == (0, 0, blocks(300))
    ids_e, (dh, ph, nb, nbytes) = meter.generate(e, 5)
    # The flood evicted: at most 24 - 19 decode and 20 - 19 prefill blocks of q survive, the
    # deepest first, so the decode side keeps more of q's head than the prefill side (80 and
    # 16 tokens here); the prefill computes from its own hit but sends only past the decode's.
    assert dh % BS == 0 and ph % BS == 0 and ph < dh <= 5 * BS, (dh, ph)
    tail = blocks(len(e)) - dh // BS
    assert (nb, nbytes) == (tail, tail * bb)
    assert ids_c == alone(offline_runner, c, 4)
    assert ids_e == alone(offline_runner, e, 5)
    assert_no_leaks(stack)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cuda_ipc", "tcp"])
def test_gpu_backends_transfer_only_the_tail(tmp_path, backend):
    """The same contract over a GPU pool: both workers on one GPU, KV over cuda_ipc or tcp."""
    import torch
    from model.hf_tiny import build_tiny

    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner
    from pdtest.tiny import word_tokenizer

    folder = build_tiny("llama3_rope", tmp_path / "m")
    spec = ModelSpec.from_dir(folder)
    word_tokenizer(folder, spec.vocab_size)
    runner = ModelRunner(spec, folder, device="cuda", dtype=torch.float32, num_blocks=64, block_size=BS)
    rng = random.Random(13)
    prefix = [rng.randrange(3, spec.vocab_size) for _ in range(100)]
    a, b = prefix + [5, 6, 7], prefix + [8, 9, 10, 11, 12]
    worker = ["--device", "cuda", "--dtype", "float32", "--num-blocks", "64", "--max-model-len", "256",
              "--kv-transfer", backend, "--max-num-batched-tokens", "32"]
    with Stack(model=str(folder), worker_args=worker, gateway_args=["--max-model-len", "256"]) as st:
        bb, meter = block_bytes(st), Meter(st)
        ids_a, (dh, _, nb, nbytes) = meter.generate(a, 8)
        assert (dh, nb, nbytes) == (0, blocks(len(a)), blocks(len(a)) * bb)
        ids_b, (dh, ph, nb, nbytes) = meter.generate(b, 8)
        assert dh == ph == 96
        assert (nb, nbytes) == (blocks(len(b)) - 6, (blocks(len(b)) - 6) * bb)
        assert ids_a == alone(runner, a, 8) and ids_b == alone(runner, b, 8)
        assert_no_leaks(st)
