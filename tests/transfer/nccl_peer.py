"""The other process of the nccl tests: `prefill ADDRESS N [--hang] [--head-dim D]` or
`decode`. Pools are seeded so that the test can compute what must arrive."""

from __future__ import annotations

import argparse
import gc
import sys
import time

import torch

from pdserve.transfer.base import KvTargetSpec, LayoutMismatch, TransferError
from pdserve.transfer.nccl import NcclKvReceiver, NcclKvSender
from transfer_helpers import make_layout, poisoned_pool, torch_dtype

SEED, SRC_BLOCKS = 1234, 64


def seeded_pool(layout, num_blocks: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED)
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads,
             layout.head_dim)
    return torch.randn(shape, generator=gen).to(torch_dtype(layout))


def src_blocks(i: int) -> list[int]:
    return [(7 * i) % SRC_BLOCKS, (7 * i + 3) % SRC_BLOCKS]


def dst_blocks(i: int) -> list[int]:
    return [2 * i + 1, 2 * i]


def prefill(args: argparse.Namespace) -> int:
    layout = make_layout(head_dim=args.head_dim)
    pool = seeded_pool(layout, SRC_BLOCKS)
    sender = NcclKvSender(layout, peer_timeout=10.0)
    try:
        handles = [sender.start(KvTargetSpec(f"r{i}", tuple(dst_blocks(i)), args.address,
                                             layout.compat_hash(), "nccl"), pool)
                   for i in range(args.n)]
    except LayoutMismatch as err:
        print(f"MISMATCH {err}", flush=True)
        return 3
    for layer in range(layout.num_layers):
        for i, handle in enumerate(handles):
            handle.push(layer, src_blocks(i), 0)
        if args.hang:
            print("PUSHED", flush=True)
            time.sleep(600)
    try:
        total = sum(handle.finish(timeout=20).bytes for handle in handles)
    except TransferError as err:
        print(f"FAILED {err}", flush=True)
        return 4
    print(f"DONE {total}", flush=True)
    sender.close()
    del handles, sender
    gc.collect()  # drop the groups before interpreter teardown
    return 0


def decode(args: argparse.Namespace) -> int:
    layout = make_layout()
    receiver = NcclKvReceiver(poisoned_pool(layout, 8), layout, peer_timeout=10.0)
    receiver.expect("r0", [1, 2])
    print(f"ADDRESS {receiver.kv_address}", flush=True)
    time.sleep(600)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["prefill", "decode"])
    p.add_argument("address", nargs="?", default="")
    p.add_argument("n", nargs="?", type=int, default=1)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--head-dim", type=int, default=8)
    args = p.parse_args()
    return prefill(args) if args.role == "prefill" else decode(args)


if __name__ == "__main__":
    sys.exit(main())
