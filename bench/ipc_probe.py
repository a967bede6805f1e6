"""Where a cuda_ipc transfer spends host time (diagnostic; one GPU): `python bench/ipc_probe.py`.

Times, with a decode-side child process holding a Llama-3.1-8B-layout pool (8k tokens): the
block-copy kernel local->peer per layer and for all layers at once, CudaCopier.copy, start(),
handle.push per layer, push_all_layers, drain and finish; then each piece of a push of a new
block set (odd count) while the engine stream sleeps ~1 s (none may wait for it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from timing import event_ms  # noqa: E402
from transfer import LLAMA_8B, KvTargetSpec, Peer, make_sender, pool_for  # noqa: E402

from pdserve.kernels.copy_blocks import PoolCopy  # noqa: E402


def timed(label: str, fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    done = time.perf_counter() - t0
    print(f"{label:44s} host {host * 1e3:8.3f} ms   done {done * 1e3:8.3f} ms", flush=True)
    return done


def main() -> None:
    layout, n, dev = LLAMA_8B, 512, torch.device("cuda")
    peer = Peer("cuda_ipc", layout, n, "cuda")
    sender = make_sender("cuda_ipc", layout)
    pool = pool_for(layout, n, dev)
    nbytes = pool.numel() * pool.element_size()
    torch.cuda.synchronize()
    blocks = list(range(n))
    ids = torch.arange(n, dtype=torch.int32, device=dev)
    for rep in range(2):
        rid = f"p{rep}"
        peer.ask(f"expect {rid} {n}")
        t0 = time.perf_counter()
        handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), pool)
        print(f"[{rep}] start {1e3 * (time.perf_counter() - t0):.3f} ms (first: maps the pool, compiles)")
        remote = sender._mapped[peer.address]
        plan = PoolCopy(pool, remote)
        timed(f"[{rep}] 32 x PoolCopy layer local->peer", lambda: [plan(ids, ids, l) for l in range(32)])
        t = timed(f"[{rep}] PoolCopy all layers local->peer", lambda: plan(ids, ids))
        print(f"[{rep}] all-layers kernel {nbytes / t / 1e9:.1f} GB/s incl. launch", flush=True)
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
        timed(f"[{rep}] handle.push_all_layers", lambda: handle.push_all_layers(blocks, 0))
        timed(f"[{rep}] drain", handle.drain)
        timed(f"[{rep}] finish", lambda: handle.finish(timeout=60))
        peer.ask(f"forget {rid}")
    rid = "sleepy"
    peer.ask(f"expect {rid} {n}")
    handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), pool)
    odd = blocks[:7]  # a new block set of an odd count: a fresh id upload
    copier = handle._copier
    steps = (("attach answer", lambda: (handle._begin(), handle._answered.wait(10))),
             ("new ids upload", lambda: copier._device_ids(odd, tuple(odd))),
             ("copy stream waits for engine", lambda: copier._stream.wait_stream(torch.cuda.current_stream())),
             ("first push of a new block set", lambda: handle.push(0, blocks[:9], 0)),
             ("second push", lambda: handle.push(1, blocks[:9], 0)),
             ("push_all_layers", lambda: handle.push_all_layers(blocks[:11], 0)))
    for label, fn in steps:
        torch.cuda._sleep(2_000_000_000)  # ~1 s of engine stream
        t0 = time.perf_counter()
        fn()
        print(f"behind a sleeping engine stream: {label:32s} host {1e3 * (time.perf_counter() - t0):8.3f} ms", flush=True)
        torch.cuda.synchronize()
    try:
        handle.finish(timeout=60)
    except Exception as err:  # noqa: BLE001 - a partial transfer may be refused; only timing matters
        print("finish:", err)
    sender.close()
    peer.close()
    ttft_marks()


def ttft_marks(n_tok: int = 2048, reps: int = 4) -> None:
    """Where the TTFT a layer-wise transfer adds goes: host times (ms from t0) of start(), layer
    0 enqueued, push 0 back, last push back (attach answered by then), execute() back, GPU done,
    seal() back (the bytes visible: the first token's moment), the ack; the forward alone beside it."""
    import json

    from pdserve.core.sampling import SamplingParams
    from pdserve.core.step_io import SeqSlice, StepInput
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_config_dict(json.loads((Path(__file__).parent / "configs/llama-3.1-8b.json").read_text()))
    n = n_tok // 16
    runner = ModelRunner(spec, None, device=torch.device("cuda"), dtype=torch.bfloat16, num_blocks=n + 1,
                         block_size=16, load_format="dummy", max_model_len=n_tok + 16, max_num_seqs=4)
    layout = runner.layout
    peer = Peer("cuda_ipc", layout, n + 1, "cuda")
    sender = make_sender("cuda_ipc", layout)
    ids = tuple(torch.randint(0, spec.vocab_size, (n_tok,)).tolist())
    step = StepInput((SeqSlice("p", ids, 0, tuple(range(n)), SamplingParams(temperature=0.0)),))
    blocks = list(range(n))
    for rep in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.execute(step)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        alone = {"execute": t1 - t0, "gpu_done": time.perf_counter() - t0}
        rid = f"ttft{rep}"
        peer.ask(f"expect {rid} {n}")
        marks: dict[str, float] = {}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), runner.kv_pool)
        marks["start"] = time.perf_counter() - t0

        def hook(layer: int) -> None:
            if layer == 0:
                marks["layer0_enqueued"] = time.perf_counter() - t0
            handle.push(layer, blocks, 0)
            if layer in (0, layout.num_layers - 1):
                marks[f"push{layer}_back"] = time.perf_counter() - t0

        runner.execute(step, layer_hook=hook)
        marks["execute"] = time.perf_counter() - t0
        torch.cuda.synchronize()
        marks["gpu_done"] = time.perf_counter() - t0
        handle.seal(timeout=60)
        marks["seal"] = time.perf_counter() - t0
        handle.finish(timeout=60)
        marks["ack"] = time.perf_counter() - t0
        peer.ask(f"forget {rid}")
        print(f"ttft {n_tok} rep {rep}: alone " + " ".join(f"{k} {v * 1e3:.2f}" for k, v in alone.items())
              + " | with transfer " + " ".join(f"{k} {v * 1e3:.2f}" for k, v in marks.items()), flush=True)
    sender.close()
    peer.close()


def ttft_variants(n_tok: int = 2048, reps: int = 6) -> None:
    """What makes a forward with layer-wise pushes slower than alone: the same prefill with a
    layer hook doing nothing, only the copy stream's wait, a copy kernel per layer into a local
    pool, into the peer's (IPC-mapped) pool, and the real push; interleaved, medians (ms)."""
    import json

    from pdserve.core.sampling import SamplingParams
    from pdserve.core.step_io import SeqSlice, StepInput
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_config_dict(json.loads((Path(__file__).parent / "configs/llama-3.1-8b.json").read_text()))
    n = n_tok // 16
    runner = ModelRunner(spec, None, device=torch.device("cuda"), dtype=torch.bfloat16, num_blocks=n + 1,
                         block_size=16, load_format="dummy", max_model_len=n_tok + 16, max_num_seqs=4)
    layout, pool = runner.layout, runner.kv_pool
    peer = Peer("cuda_ipc", layout, n + 1, "cuda")
    sender = make_sender("cuda_ipc", layout)
    ids = tuple(torch.randint(0, spec.vocab_size, (n_tok,)).tolist())
    step = StepInput((SeqSlice("p", ids, 0, tuple(range(n)), SamplingParams(temperature=0.0)),))
    blocks = list(range(n))
    peer.ask("expect warm 1")
    warm = sender.start(KvTargetSpec("warm", (0,), peer.address, layout.compat_hash(), ""), pool)
    warm.push_all_layers([0], 0)
    warm.finish(timeout=60)
    copier, remote = warm._copier, sender._mapped[peer.address]
    local = torch.empty_like(pool)
    copier.prepare(pool, local)
    side = copier._stream
    handles: list = []

    def push_hook():
        rid = f"v{len(handles)}"
        peer.ask(f"expect {rid} {n}")
        handle = sender.start(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""), pool)
        handles.append((rid, handle))
        return lambda layer: handle.push(layer, blocks, 0)

    class NullCopier:  # the push machinery without copy kernels
        def copy(self, *args, **kw) -> None:
            pass

        def synchronize(self) -> None:
            pass

    def push_attached():  # the attach answered before the forward: no call set-up during it
        hook = push_hook()
        handle = handles[-1][1]
        handle._begin()
        handle._answered.wait(10)
        return hook

    def push_no_copy():
        from pdserve.proto import kv_pb2_grpc
        from pdserve.transfer.cuda_ipc import _IpcSendHandle

        rid = f"v{len(handles)}"
        peer.ask(f"expect {rid} {n}")
        stub = kv_pb2_grpc.KvTransferStub(sender._channel(peer.address))
        handle = _IpcSendHandle(KvTargetSpec(rid, tuple(blocks), peer.address, layout.compat_hash(), ""),
                                pool, layout, sender._peer(peer.address, stub)[1], remote, NullCopier(), 10.0)
        handles.append((rid, handle))
        return lambda layer: handle.push(layer, blocks, 0)

    variants = {
        "alone": lambda: None,
        "hook_noop": lambda: (lambda layer: None),
        "hook_stream_wait": lambda: (lambda layer: side.wait_stream(torch.cuda.current_stream())),
        "hook_copy_local": lambda: (lambda layer: copier.copy(local, pool, layer, blocks, blocks)),
        "hook_copy_peer": lambda: (lambda layer: copier.copy(remote, pool, layer, blocks, blocks)),
        "push": push_hook,
        "push_attached": push_attached,
        "push_no_copy": push_no_copy,
    }
    # A 0.5 ms GIL switch interval (sys.setswitchinterval) was tried here on 2026-12-03 and
    # made no difference beyond the noise (push +4.9 % at 5 ms, +6.1 % at 0.5 ms).
    variant_times(runner, step, variants, handles, peer, reps, f"switch interval {sys.getswitchinterval() * 1e3:g} ms")
    sender.close()
    peer.close()


def variant_times(runner, step, variants: dict, handles: list, peer: Peer, reps: int, label: str) -> None:
    import statistics

    times: dict[str, list[float]] = {k: [] for k in variants}
    enqueued: dict[str, list[float]] = {k: [] for k in variants}  # the last layer's hook returned
    first: dict[str, list[float]] = {k: [] for k in variants}  # layer 0's hook returned
    last = runner.layout.num_layers - 1
    for rep in range(reps + 1):
        for name, make in variants.items():
            inner = make()
            marks: list[float] = []

            def hook(layer: int, inner=inner, marks=marks) -> None:
                if inner is not None:
                    inner(layer)
                if layer in (0, last):
                    marks.append(time.perf_counter())

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            runner.execute(step, layer_hook=hook if inner is not None else None)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            if rep and marks:
                first[name].append(marks[0] - t0)
                enqueued[name].append(marks[-1] - t0)
            if handles:
                rid, handle = handles.pop()
                handle.finish(timeout=60)
                peer.ask(f"forget {rid}")
            if rep:
                times[name].append(dt)
    base = statistics.median(times["alone"])
    print(f"ttft variants, {label}: " + "  ".join(f"{k} {statistics.median(v) * 1e3:.2f}"
          f" (+{(statistics.median(v) - base) / base * 100:.1f}%)" for k, v in times.items()), flush=True)
    print("hooks of layer 0 / the last layer returned at (ms): " + "  ".join(
        f"{k} {statistics.median(first[k]) * 1e3:.2f} / {statistics.median(v) * 1e3:.2f}"
        for k, v in enqueued.items() if v), flush=True)


def copy_variants() -> None:
    """Device-timed (events) GB/s of the all-layers block copy local->peer (8k tokens of the
    Llama-3.1-8B layout) per kernel shape, beside a same-device copy_ of as many bytes."""
    layout, n, dev = LLAMA_8B, 512, torch.device("cuda")
    peer = Peer("cuda_ipc", layout, n, "cuda")
    sender = make_sender("cuda_ipc", layout)
    pool = pool_for(layout, n, dev)
    nbytes = pool.numel() * pool.element_size()
    peer.ask(f"expect c {n}")
    handle = sender.start(KvTargetSpec("c", tuple(range(n)), peer.address, layout.compat_hash(), ""), pool)
    remote = sender._mapped[peer.address]
    ids = torch.arange(n, dtype=torch.int32, device=dev)
    flat = pool.view(-1)
    other = torch.empty_like(flat)
    ms = event_ms(lambda: other.copy_(flat))
    print(f"copy_ of {nbytes / 2**20:.0f} MiB: {ms:.3f} ms {nbytes / ms / 1e6:.1f} GB/s (bytes once)", flush=True)
    for words in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            plan = PoolCopy(pool, remote, words_per_program=words, num_warps=warps)
            t = event_ms(lambda: plan(ids, ids))
            print(f"PoolCopy words {words:5d} warps {warps:2d}: {t:.3f} ms {nbytes / t / 1e6:7.1f} GB/s"
                  f" ({ms / t:.3f} of copy_)", flush=True)
    handle.abort()
    sender.close()
    peer.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["variants"]:
        ttft_variants()
    elif sys.argv[1:] == ["copy"]:
        copy_variants()
    else:
        main()
