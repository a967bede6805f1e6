"""Where a cuda_ipc push spends host time (diagnostic; one GPU): `python bench/ipc_probe.py`.

Times, with a decode-side child process holding a Llama-3.1-8B-layout pool: the block-copy kernel
local->local and local->peer (IPC-mapped), CudaCopier.copy, handle.push per layer; then the same
first push while the engine stream sleeps ~1 s (a push must not wait for it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from transfer import LLAMA_8B, KvTargetSpec, Peer, make_sender, pool_for  # noqa: E402

from kernels.copy_blocks import copy_blocks  # noqa: E402


def timed(label: str, fn) -> None:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"{label:44s} host {host * 1e3:8.3f} ms   done {(time.perf_counter() - t0) * 1e3:8.3f} ms", flush=True)


def main() -> None:
    layout, n, dev = LLAMA_8B, 512, torch.device("cuda")
    peer = Peer("cuda_ipc", layout, n, "cuda")
    sender = make_sender("cuda_ipc", layout)
    pool = pool_for(layout, n, dev)
    dst = torch.empty_like(pool)
    ids = torch.arange(n, dtype=torch.int32, device=dev)
    blocks = list(range(n))
    for rep in range(2):
        timed(f"[{rep}] 32 x copy_blocks local->local", lambda: [copy_blocks(pool[l], dst[l], ids, ids) for l in range(32)])
        rid = f"p{rep}"
        peer.ask(f"expect {rid} {n}")
        t0 = time.perf_counter()
        handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), pool)
        print(f"[{rep}] start {1e3 * (time.perf_counter() - t0):.3f} ms")
        remote = sender._mapped[peer.address]
        timed(f"[{rep}] 32 x copy_blocks local->peer", lambda: [copy_blocks(pool[l], remote[l], ids, ids) for l in range(32)])
        copier = handle._copier
        timed(f"[{rep}] 32 x CudaCopier.copy", lambda: [copier.copy(remote, pool, l, blocks, blocks) for l in range(32)])
        per = []

        def pushes() -> None:
            for l in range(32):
                t = time.perf_counter()
                handle.push(l, blocks, 0)
                per.append(time.perf_counter() - t)
        timed(f"[{rep}] 32 x handle.push", pushes)
        print(f"[{rep}] push ms: first {per[0] * 1e3:.3f} median {sorted(per)[16] * 1e3:.3f} max {max(per) * 1e3:.3f}")
        timed(f"[{rep}] drain", handle.drain)
        timed(f"[{rep}] finish", lambda: handle.finish(timeout=60))
        peer.ask(f"forget {rid}")
    rid = "sleepy"
    peer.ask(f"expect {rid} {n}")
    handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), pool)
    torch.cuda._sleep(2_000_000_000)
    for label, fn in (("tensor on a side stream", lambda: _side_tensor(blocks)),
                      ("first push behind a sleeping engine stream", lambda: handle.push(0, blocks[:7], 0)),
                      ("second push", lambda: handle.push(1, blocks[:7], 0))):
        t0 = time.perf_counter()
        fn()
        print(f"{label:44s} host {1e3 * (time.perf_counter() - t0):8.3f} ms", flush=True)
    torch.cuda.synchronize()
    try:
        handle.finish(timeout=60)
    except Exception as err:  # noqa: BLE001 - a partial transfer may be refused; only timing matters
        print("finish:", err)
    sender.close()
    peer.close()


def _side_tensor(blocks: list[int]) -> None:
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.tensor([blocks, blocks], dtype=torch.int32, device="cuda")


if __name__ == "__main__":
    main()
