"""Decode process of the cuda_ipc GPU tests: serves a CudaIpcKvReceiver over a poisoned pool,
prints its address, then answers commands on stdin:
  dump <rid> <b0,b1,...>    -> STATE <complete> <sum> <abs sum> of those blocks
  forget <rid> <b0,b1,...>  -> FORGET <freed at once>; when the blocks are released (at once or
                               later), they are reused (filled with REUSED) -> RELEASED <seconds held>
  reused <b0,b1,...>        -> REUSED <True if every value of those blocks is still REUSED>
  expect <rid> <b0,b1,...>  -> EXPECTED (a new reservation)
"""

from __future__ import annotations

import sys
import threading
import time

import torch

from pdserve.transfer.cuda_ipc import CudaIpcKvReceiver
from transfer_helpers import AioServer, make_layout, poisoned_pool

REUSED = -5.0


def _ids(text: str) -> list[int]:
    return [int(b) for b in text.split(",")]


def main() -> int:
    layout = make_layout("bfloat16")
    pool = poisoned_pool(layout, 32).cuda()
    receiver = CudaIpcKvReceiver(pool, layout, writer_grace_s=5.0)
    receiver.expect("r1", [17, 3, 29, 8, 11])
    server = AioServer(receiver)
    print(f"ADDRESS {server.address}", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "dump":
            ids = _ids(args[1])
            torch.cuda.synchronize()
            data = pool[:, :, ids].float().cpu()
            print(f"STATE {receiver.is_complete(args[0])} {data.sum().item():.6f} "
                  f"{data.abs().sum().item():.6f}", flush=True)
        elif cmd == "forget":
            ids, released, t0 = _ids(args[1]), threading.Event(), time.monotonic()
            at_once = receiver.forget(args[0], on_released=released.set)
            print(f"FORGET {at_once}", flush=True)
            if at_once:
                released.set()
            released.wait(60)
            pool[:, :, ids] = REUSED  # the decode engine hands the blocks to another request
            torch.cuda.synchronize()
            print(f"RELEASED {time.monotonic() - t0:.3f}", flush=True)
        elif cmd == "expect":
            receiver.expect(args[0], _ids(args[1]))
            print("EXPECTED", flush=True)
        elif cmd == "reused":
            torch.cuda.synchronize()
            print(f"REUSED {bool((pool[:, :, _ids(args[0])] == REUSED).all())}", flush=True)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
