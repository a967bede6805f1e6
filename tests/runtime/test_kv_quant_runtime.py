"""Quantized KV pools in the runtime: greedy agreement, handshake refusal, loopback transfer."""

from __future__ import annotations

import argparse

import pytest
import torch

from pdserve.core.sampling import SamplingParams
from pdserve.model.spec import ModelSpec
from pdserve.runtime.kv_cache import kv_layout
from pdserve.runtime.kv_quant import layer_views, quant_kv_layout
from pdserve.runtime.offline import generate
from pdserve.runtime.runner import ModelRunner
from pdserve.transfer.base import KvTargetSpec, LayoutMismatch, TransferState
from pdserve.transfer.loopback import LoopbackKvReceiver, LoopbackKvSender
from pdserve.worker import add_worker_args

SPEC = ModelSpec.from_config_dict(dict(
    model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2, head_dim=32,
    num_attention_heads=4, num_key_value_heads=2, vocab_size=320, max_position_embeddings=256,
))
PROMPTS = [[(7 * i + j * j) % 320 for j in range(24)] for i in range(6)]


def _runner(kv_cache_dtype: str) -> ModelRunner:
    return ModelRunner(SPEC, None, num_blocks=64, block_size=8, load_format="dummy", seed=5,
                       kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize(("kv", "floor"), [("fp8_e4m3", 0.6), ("int8", 0.8)])
def test_quantized_pool_greedy_agreement(kv: str, floor: float) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = generate(_runner("auto"), PROMPTS, params)
    quant_runner = _runner(kv)
    got = generate(quant_runner, PROMPTS, params)
    # share of tokens equal to the full-precision run, position by position
    same = sum(a == b for x, y in zip(base, got) for a, b in zip(x, y))
    share = same / sum(len(x) for x in base)
    print(f"greedy agreement {kv}: {share:.3f}")
    assert share >= floor
    views = layer_views(quant_runner.kv_pool, 0, SPEC.head_dim)
    assert views.k_scale is not None and float(views.k_scale.max()) > 0  # scales were written


def test_bf16_prefill_and_fp8_decode_refuse_to_pair() -> None:
    fp8 = quant_kv_layout(SPEC, 8, "fp8_e4m3")
    bf16 = kv_layout(SPEC, 8, torch.bfloat16)
    receiver = LoopbackKvReceiver(torch.zeros(2, 2, 4, 8, 2, 36, dtype=torch.float8_e4m3fn), fp8)
    sender = LoopbackKvSender(bf16, {"decode-0": receiver})
    target = KvTargetSpec("r1", (0,), "decode-0", fp8.compat_hash(), "loopback")
    with pytest.raises(LayoutMismatch, match="dtype=bfloat16.*dtype=fp8_e4m3") as err:
        sender.start(target, torch.zeros(2, 2, 4, 8, 2, 32, dtype=torch.bfloat16))
    assert err.value.code == "FAILED_PRECONDITION" and not err.value.retryable


@pytest.mark.parametrize("kv", ["fp8_e4m3", "int8"])
def test_loopback_moves_quantized_blocks_with_scales(kv: str) -> None:
    src_runner, dst_runner = _runner(kv), _runner(kv)
    generate(src_runner, PROMPTS[:2], SamplingParams(temperature=0.0, max_tokens=2))
    layout = src_runner.layout
    receiver = LoopbackKvReceiver(dst_runner.kv_pool, layout)
    sender = LoopbackKvSender(layout, {"decode-0": receiver})
    src_blocks, dst_blocks = [0, 1, 2], [10, 11, 12]
    receiver.expect("r1", dst_blocks)
    handle = sender.start(KvTargetSpec("r1", tuple(dst_blocks), "decode-0", layout.compat_hash(),
                                       "loopback"), src_runner.kv_pool)
    for layer in range(SPEC.num_layers):
        handle.push(layer, src_blocks, 0)
    stats = handle.finish(timeout=5)
    assert handle.state == TransferState.DONE
    assert stats.bytes == SPEC.num_layers * 3 * 2 * 8 * 2 * (32 + 4)  # about half of bf16
    src, dst = src_runner.kv_pool, dst_runner.kv_pool
    assert torch.equal(src[:, :, src_blocks].view(torch.uint8), dst[:, :, dst_blocks].view(torch.uint8))
    a, b = layer_views(src, 1, 32), layer_views(dst, 1, 32)
    assert torch.equal(a.k_scale[src_blocks], b.k_scale[dst_blocks])
    assert float(b.v_scale[dst_blocks].min()) > 0


def test_quant_views_tile_each_block_and_keep_rows_aligned() -> None:
    """Values and scales of every (layer, K/V, block) are disjoint and cover it exactly, and the
    value rows stay 16-byte aligned for D = 128 (what the kernels' wide loads need)."""
    from pdserve.runtime.kv_quant import allocate_quant_pool

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=256, intermediate_size=256, num_hidden_layers=2, head_dim=128,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=64, max_position_embeddings=64))
    pool = allocate_quant_pool(spec, num_blocks=3, block_size=4, kv_cache_dtype="fp8_e4m3")
    raw = pool.view(torch.uint8)
    for layer in range(2):
        views = layer_views(pool, layer, 128)
        for kv, (vals, sc) in enumerate(((views.k, views.k_scale), (views.v, views.v_scale))):
            vals.view(torch.uint8).fill_(1 + 2 * kv)
            sc.view(torch.int32).fill_(0x05050505 if kv == 0 else 0x07070707)
        for kv in range(2):
            for blk in range(3):
                block = raw[layer, kv, blk].flatten()
                n_val = 4 * 2 * 128
                assert (block[:n_val] == 1 + 2 * kv).all() and (block[n_val:] == 5 + 2 * kv).all()
        assert views.k.stride()[1:] == (128, 4 * 128, 1) and views.k.stride(0) % 16 == 0  # head-major
        assert views.k.data_ptr() % 16 == 0 or raw.data_ptr() % 16 != 0


def test_quant_values_and_scales_are_head_major_in_each_block() -> None:
    """One KV head's values, and its scales, of a block are contiguous (an attention program
    reads one KV head: a page in one run of bytes, not S loads Hk rows apart)."""
    from pdserve.runtime.kv_quant import allocate_quant_pool

    spec = ModelSpec.from_config_dict(dict(
        model_type="llama", hidden_size=64, intermediate_size=64, num_hidden_layers=1, head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64, max_position_embeddings=64))
    pool = allocate_quant_pool(spec, num_blocks=2, block_size=4, kv_cache_dtype="int8")
    views = layer_views(pool, 0, 16)
    for slot in range(4):
        for head in range(2):
            views.k_scale[1, slot, head] = 10 * head + slot  # (block 1, slot, KV head)
    tail = pool[0, 0, 1].flatten()[4 * 2 * 16:].view(torch.float32)  # block 1's scales, as stored
    assert tail.tolist() == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]  # head 0's slots, then head 1's
    assert views.k_scale.stride()[1:] == (1, 4)
    for slot in range(4):
        for head in range(2):
            views.k[1, slot, head] = torch.full((16,), 10 * head + slot, dtype=torch.int8)
    values = pool[0, 0, 1].flatten()[: 4 * 2 * 16].view(2, 4, 16)  # block 1's values, as stored
    assert values[:, :, 0].tolist() == [[0, 1, 2, 3], [10, 11, 12, 13]]  # head 0's rows, then head 1's
    assert (values == values[:, :, :1]).all()


def test_kv_cache_dtype_flag_takes_vllm_spelling_and_refuses_others(capsys) -> None:
    p = argparse.ArgumentParser()
    add_worker_args(p)
    parse = lambda *a: p.parse_args(["--port", "0", *a]).kv_cache_dtype  # noqa: E731
    assert (parse("--kv-cache-dtype", "fp8"), parse("--kv-cache-dtype", "int8"), parse()) == ("fp8_e4m3", "int8", "auto")
    with pytest.raises(SystemExit):
        parse("--kv-cache-dtype", "fp8_e5m2")
    assert "--kv-cache-dtype: invalid choice: 'fp8_e5m2'" in capsys.readouterr().err
