"""Decode process of the cuda_ipc GPU test: serves a CudaIpcKvReceiver over a seeded pool,
prints its address, then on stdin 'dump <rid> <b0,b1,...>' prints completion and a checksum."""

from __future__ import annotations

import sys

import torch

from pdserve.transfer.cuda_ipc import CudaIpcKvReceiver
from transfer_helpers import AioServer, make_layout, poisoned_pool


def main() -> int:
    layout = make_layout("bfloat16")
    pool = poisoned_pool(layout, 32).cuda()
    receiver = CudaIpcKvReceiver(pool, layout)
    receiver.expect("r1", [17, 3, 29, 8, 11])
    server = AioServer(receiver)
    print(f"ADDRESS {server.address}", flush=True)
    for line in sys.stdin:
        _, rid, blocks = line.split()
        ids = [int(b) for b in blocks.split(",")]
        torch.cuda.synchronize()
        data = pool[:, :, ids].float().cpu()
        print(f"STATE {receiver.is_complete(rid)} {data.sum().item():.6f} "
              f"{data.abs().sum().item():.6f}", flush=True)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
