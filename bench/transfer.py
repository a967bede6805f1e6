"""KV transfer benchmark: prefill -> decode between two real processes, per backend.

python bench/transfer.py --out bench/results/transfer-<device>-<date>.json [--backends tcp,nccl]
                         [--tokens 2048,8192] [--reps 3] [--tiny]

This process is the prefill side (a KvSender over its own pool); it starts the decode side
(`--role receiver`: a KvReceiver over a pool of the same layout) as a child process, on the same
device. For each backend and prompt length it moves the KV of one prompt twice: every layer in
one push (push_all_layers, one kernel on cuda_ipc: what the prefill worker does with blocks its
prefix cache holds) and layer by layer (what it does while computing them), and reports payload
GB/s (KV bytes / seconds from start to the receiver's ack; median of --reps after one warmup)
and, for direct writers, the copy phase alone (from after the attach answer until every copy
landed), each as a ratio to the copy bandwidth of the device measured in the same run (a
same-device copy of a large buffer, bytes counted once, like the payload: device-to-device on
CUDA, memcpy on CPU). On CUDA the copy phase is also timed on the device: CUDA events on the
copy stream around the pushes, queued behind a short spin so that host launch time falls
outside, over a copy_ of the same size timed with events (`copy_phase_device_*`). The headline
cuda_ipc_GBps / cuda_ipc_bw_ratio is that device-timed all-layers copy against the event-timed
copy_ (the bandwidth of the copy mechanism); the host-timed copy phase (which adds the Python
of the push and the drain to a ~0.5 ms copy) stays beside it as cuda_ipc_host_timed_*.

TTFT: the model runner prefills one prompt with no transfer, then with the transfer hooked in
per layer (the prefill worker's layer-wise overlap: layer l is pushed as soon as it is written,
and the first token counts once seal() returned, as in the prefill worker: every byte visible to
the receiver; for tcp and nccl that is the receiver's ack, for cuda_ipc the copies landed and
the ack follows off the first token's path). Reported: the medians, the added fraction, and the
same up to the ack (`added_ratio_to_ack`). On CUDA the model is Llama-3.1-8B (bench/configs, dummy
weights, bf16); on CPU it is SmolLM2-135M's shape in float32 at shorter prompts (an 8B prefill
on CPU takes minutes). Backends: auto = tcp and nccl (gloo) on CPU; cuda_ipc, nccl and tcp on
CUDA (nccl needs two GPUs: NCCL refuses two ranks on one device, recorded as an error).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pdserve.bench.provenance import source_commit  # noqa: E402
from pdserve.core.kv_layout import KvLayout  # noqa: E402
from pdserve.transfer import make_receiver, make_sender  # noqa: E402
from pdserve.transfer._wire import block_bytes, torch_dtype  # noqa: E402
from pdserve.transfer.base import KvTargetSpec, TransferError  # noqa: E402

LLAMA_8B = KvLayout(model="llama-3.1-8b", num_layers=32, num_kv_heads=8, head_dim=128,
                    block_size=16, dtype="bfloat16")
QWEN_7B = KvLayout(model="qwen2.5-7b", num_layers=28, num_kv_heads=4, head_dim=128,
                   block_size=16, dtype="bfloat16")
TINY = KvLayout(model="tiny", num_layers=2, num_kv_heads=2, head_dim=16, block_size=16,
                dtype="float32")
SMOLLM2 = {  # SmolLM2-135M's shape (the default model), dummy weights
    "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
TINY_MODEL = dict(SMOLLM2, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def pool_for(layout: KvLayout, num_blocks: int, device: torch.device) -> torch.Tensor:
    shape = (layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim)
    return torch.randn(shape, device=device).to(torch_dtype(layout))


# ---- decode side (child process) -------------------------------------------------------------

async def receiver_main(backend: str, layout: KvLayout, num_blocks: int, device: torch.device) -> None:
    """Serve a receiver; stdin: `expect RID N` (blocks 0..N-1), `forget RID`; EOF ends."""
    import grpc

    from pdserve.transfer.tcp import TCP_GRPC_OPTIONS

    pool = torch.zeros((layout.num_layers, 2, num_blocks, layout.block_size, layout.num_kv_heads,
                        layout.head_dim), dtype=torch_dtype(layout), device=device)
    kw = {"host": "127.0.0.1", "port": 0} if backend == "nccl" else {}
    receiver = make_receiver(backend, pool, layout, **kw)
    server = None
    address = getattr(receiver, "kv_address", "")
    if hasattr(receiver, "add_to_server"):
        server = grpc.aio.server(options=TCP_GRPC_OPTIONS)
        receiver.add_to_server(server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
    print(f"ADDRESS {address}", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        cmd, rid, *rest = line.split()
        if cmd == "expect":
            receiver.expect(rid, list(range(int(rest[0]))))
        else:
            receiver.forget(rid)
        print("OK", flush=True)
    if server is not None:
        await server.stop(None)
    if hasattr(receiver, "close"):
        receiver.close()


class Peer:
    """The decode-side child process."""

    def __init__(self, backend: str, layout: KvLayout, num_blocks: int, device: str) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--role", "receiver", "--backends", backend,
             "--layout", json.dumps(dataclasses.asdict(layout)), "--blocks", str(num_blocks),
             "--device", device, "--out", "-"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line.startswith("ADDRESS "):
            self.close()
            raise RuntimeError(f"receiver did not start: {line!r}")
        self.address = line.split()[1]

    def ask(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "OK":
            raise RuntimeError(f"receiver refused {line!r}")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---- prefill side -----------------------------------------------------------------------------

def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """GB/s of a same-device copy of `nbytes` (each byte counted once), median of 10."""
    a = torch.randn(nbytes // 4, device=device)
    b = torch.empty_like(a)
    times = []
    for i in range(12):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


@dataclasses.dataclass(frozen=True)
class Moved:
    seconds: float  # from start to the receiver's ack
    sealed: float  # from start to seal(): the bytes visible, what the prefill worker waits for
    nbytes: int
    copy_gbps: float | None  # the copy phase (direct writers), else None
    copy_device_gbps: float | None = None  # the same, timed on the copy stream (CUDA)


def one_transfer(sender, peer: Peer, pool: torch.Tensor, layout: KvLayout, n_blocks: int,
                 rid: str, hook_into=None, all_layers: bool = True) -> Moved:
    """Move blocks 0..n-1 of every layer: seconds to seal() and to the ack, bytes, copy-phase
    GB/s or None. all_layers: one push_all_layers (one kernel on cuda_ipc), else a push per
    layer. With `hook_into(hook)`, the caller runs the per-layer pushes from its forward. The
    copy phase (direct-write backends, which can `drain`): the pushes after the attach answer
    (a first push of one layer, drained) until they all landed."""
    peer.ask(f"expect {rid} {n_blocks}")
    target = KvTargetSpec(rid, tuple(range(n_blocks)), peer.address, layout.compat_hash(), "")
    blocks = list(range(n_blocks))
    t0 = time.perf_counter()
    handle = sender.start(target, pool)
    copy_gbps = copy_device_gbps = None
    drain = getattr(handle, "drain", None)

    def push_every_layer() -> None:
        if all_layers:
            handle.push_all_layers(blocks, 0)
        else:
            for layer in range(layout.num_layers):
                handle.push(layer, blocks, 0)

    if hook_into is not None:
        hook_into(lambda layer: handle.push(layer, blocks, 0))
    elif drain is None:
        push_every_layer()
    else:
        handle.push(0, blocks, 0)  # kept until the attach answer; layer 0 is sent again below
        drain()  # waits for the answer and the copy
        t1 = time.perf_counter()
        events = device_events(getattr(handle, "copy_stream", None))
        push_every_layer()
        if events is not None:
            events[1].record(handle.copy_stream)
        drain()
        payload = layout.num_layers * n_blocks * block_bytes(layout)
        copy_gbps = payload / (time.perf_counter() - t1) / 1e9
        if events is not None:
            copy_device_gbps = payload / (events[0].elapsed_time(events[1]) * 1e-3) / 1e9
    handle.seal(timeout=600)
    sync(pool.device)
    sealed = time.perf_counter() - t0
    stats = handle.finish(timeout=600)
    seconds = time.perf_counter() - t0
    peer.ask(f"forget {rid}")
    nbytes = layout.num_layers * n_blocks * block_bytes(layout)  # the payload (layer 0 counted once)
    assert stats.bytes >= nbytes, (stats.bytes, nbytes)
    return Moved(seconds, sealed, nbytes, copy_gbps, copy_device_gbps)


def device_events(stream: Any) -> tuple[Any, Any] | None:
    """(start, end) CUDA events for timing work queued next on `stream` (None: not CUDA): the
    stream first spins ~0.2 ms, so the start event fires once the host has queued what follows."""
    if stream is None:
        return None
    events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    with torch.cuda.stream(stream):
        torch.cuda._sleep(400_000)  # cycles: ~0.2 ms at the H200's clock
    events[0].record(stream)
    return events


def copy_bandwidth_events(device: torch.device, nbytes: int) -> float | None:
    """GB/s of a same-device copy_ of `nbytes` timed with CUDA events (bytes once), median of
    10 after 2 warm-ups; None off CUDA."""
    if device.type != "cuda":
        return None
    a = torch.randn(nbytes // 4, device=device)
    b = torch.empty_like(a)
    times = []
    for i in range(12):
        events = device_events(torch.cuda.current_stream(device))
        assert events is not None
        b.copy_(a)
        events[1].record()
        events[1].synchronize()
        if i >= 2:
            times.append(events[0].elapsed_time(events[1]) * 1e-3)
    return nbytes / statistics.median(times) / 1e9


def bench_backend(backend: str, layout: KvLayout, tokens: list[int], reps: int, device: torch.device,
                  copy_gbps: float, copy_events_gbps: float | None = None) -> dict[str, Any]:
    """Per prompt length: every layer in one push (push_all_layers: what the prefill worker does
    with blocks it already holds) and layer by layer (what it does while computing them)."""
    n_max = max(tokens) // layout.block_size
    peer = Peer(backend, layout, n_max, str(device))
    sender = make_sender(backend, layout)
    try:
        pool = pool_for(layout, n_max, device)
        out: dict[str, Any] = {}
        for n_tok in tokens:
            n = n_tok // layout.block_size
            row: dict[str, Any] = {"reps": reps}
            for mode, all_layers in (("", True), ("layerwise_", False)):
                runs = [one_transfer(sender, peer, pool, layout, n, f"{mode}{n_tok}-{i}", all_layers=all_layers)
                        for i in range(reps + 1)]
                seconds = statistics.median(r.seconds for r in runs[1:])
                gbps = runs[0].nbytes / seconds / 1e9
                row |= {f"{mode}seconds": seconds, f"{mode}GBps": gbps, f"{mode}ratio_to_copy": gbps / copy_gbps}
                line = ""
                if runs[0].copy_gbps is not None:
                    phase = statistics.median(r.copy_gbps for r in runs[1:])
                    row |= {f"{mode}copy_phase_GBps": phase, f"{mode}copy_phase_ratio_to_copy": phase / copy_gbps}
                    line = f"  copy phase {phase:7.1f} GB/s ({phase / copy_gbps:.3f})"
                if runs[0].copy_device_gbps is not None and copy_events_gbps:
                    dev = statistics.median(r.copy_device_gbps for r in runs[1:])
                    row |= {f"{mode}copy_phase_device_GBps": dev,
                            f"{mode}copy_phase_device_ratio_to_copy": dev / copy_events_gbps}
                    line += f"  on the device {dev:7.1f} GB/s ({dev / copy_events_gbps:.3f})"
                row["bytes"] = runs[0].nbytes
                print(f"{backend:8s} {n_tok:6d} tokens {'per layer' if mode else 'all layers'}"
                      f"  {runs[0].nbytes / 2**20:8.1f} MiB  {seconds * 1e3:8.1f} ms"
                      f"  {gbps:7.2f} GB/s  ({gbps / copy_gbps:.3f} of copy){line}", flush=True)
            out[str(n_tok)] = row
        return out
    finally:
        sender.close()
        peer.close()


def bench_ttft(backend: str, model: dict, tokens: list[int], reps: int, device: torch.device,
               late_attach: bool = False) -> dict:
    """Prefill time of one prompt alone vs with its KV pushed per layer and acknowledged.
    late_attach (cuda_ipc): also, interleaved, a sender that attaches with its first push
    instead of at start() (`ttft_ms_with_transfer_late_attach`, `added_ratio_late_attach`)."""
    from pdserve.core.sampling import SamplingParams
    from pdserve.core.step_io import SeqSlice, StepInput
    from pdserve.model.spec import ModelSpec
    from pdserve.runtime.runner import ModelRunner

    spec = ModelSpec.from_config_dict(model)
    n_max = max(tokens) // 16 + 1
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    runner = ModelRunner(spec, None, device=device, dtype=dtype, num_blocks=n_max, block_size=16,
                         load_format="dummy", max_model_len=max(tokens) + 16, max_num_seqs=4)
    layout = runner.layout
    peer = Peer(backend, layout, n_max, str(device))
    sender = make_sender(backend, layout)
    late = make_sender(backend, layout, attach_at_start=False) if late_attach else None
    out: dict[str, Any] = {"model": spec.name or model.get("model_type"), "layout": layout.describe()}
    try:
        for n_tok in tokens:
            ids = tuple(torch.randint(0, spec.vocab_size, (n_tok,)).tolist())
            n = (n_tok + 15) // 16
            step = StepInput((SeqSlice("p", ids, 0, tuple(range(n)), SamplingParams(temperature=0.0)),))

            def alone(_i: int = 0) -> float:
                sync(device)
                t0 = time.perf_counter()
                runner.execute(step)
                sync(device)
                return time.perf_counter() - t0

            def with_transfer(i: int, via: Any, tag: str) -> tuple[float, float]:
                """(seconds to seal, seconds to the ack) of a prefill pushing its KV per layer."""
                m = one_transfer(via, peer, runner.kv_pool, layout, n, f"{tag}-{n_tok}-{i}",
                                 hook_into=lambda hook: runner.execute(step, layer_hook=hook))
                return m.sealed, m.seconds

            def after_prefill(i: int) -> float:  # no overlap: prefill, then every layer at once
                t = alone()
                return t + one_transfer(sender, peer, runner.kv_pool, layout, n, f"seq-{n_tok}-{i}").sealed

            runs: dict[str, Any] = {"alone": alone, "overlap": lambda i: with_transfer(i, sender, "ttft"),
                                    "serial": after_prefill}
            if late is not None:
                runs["late"] = lambda i: with_transfer(i, late, "late")
            names = list(runs)
            got: dict[str, list] = {name: [] for name in names}
            for i in range(reps + 1):  # interleaved, the first of each is warmup; the order
                for j in range(len(names)):  # rotates each rep (a run's place moved its time by
                    name = names[(i + j) % len(names)]  # ~3 % of a 2k TTFT: transfer-...-s9b.json)
                    got[name].append(runs[name](i))

            def median(name: str, part: int | None = None) -> float:
                return statistics.median(v if part is None else v[part] for v in got[name][1:])

            b, x, a, y = median("alone"), median("overlap", 0), median("overlap", 1), median("serial")
            out[str(n_tok)] = {"ttft_ms_no_transfer": b * 1e3, "ttft_ms_with_transfer": x * 1e3,
                               "ttft_ms_transfer_after_prefill": y * 1e3,
                               "ttft_ms_with_transfer_to_ack": a * 1e3,
                               "added_ratio": (x - b) / b, "added_ratio_no_overlap": (y - b) / b,
                               "added_ratio_to_ack": (a - b) / b, "reps": reps}
            if late is not None:
                z, za = median("late", 0), median("late", 1)
                out[str(n_tok)] |= {"ttft_ms_with_transfer_late_attach": z * 1e3, "added_ratio_late_attach": (z - b) / b,
                                    "ttft_ms_with_transfer_to_ack_late_attach": za * 1e3}
                print(f"{backend:8s} TTFT {n_tok:6d} tokens  attach with the first push: to the ack {za * 1e3:8.1f} ms,"
                      f" {z * 1e3:8.1f} ms"
                      f" (+{(z - b) / b * 100:.1f} %)", flush=True)
            print(f"{backend:8s} TTFT {n_tok:6d} tokens  {b * 1e3:8.1f} ms alone  {x * 1e3:8.1f} ms with"
                  f" layer-wise transfer (+{(x - b) / b * 100:.1f} %)  {y * 1e3:8.1f} ms transfer after"
                  f" prefill (+{(y - b) / b * 100:.1f} %)  to the ack {a * 1e3:8.1f} ms (+{(a - b) / b * 100:.1f} %)",
                  flush=True)
        return out
    finally:
        sender.close()
        if late is not None:
            late.close()
        peer.close()


def auto_backends(device: torch.device) -> list[str]:
    return ["cuda_ipc", "nccl", "tcp"] if device.type == "cuda" else ["tcp", "nccl"]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def run(a: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(a.device)
    layouts = [TINY] if a.tiny else [LLAMA_8B, QWEN_7B]
    tokens = [int(t) for t in a.tokens.split(",")] if a.tokens else ([64, 256] if a.tiny else [2048, 8192])
    ttft_tokens = [int(t) for t in a.ttft_tokens.split(",")] if a.ttft_tokens else (
        [64] if a.tiny else ([2048, 8192] if device.type == "cuda" else [512]))
    backends = a.backends.split(",") if a.backends != "auto" else auto_backends(device)
    model = TINY_MODEL if a.tiny else (
        json.loads((ROOT / "bench/configs/llama-3.1-8b.json").read_text()) if device.type == "cuda" else SMOLLM2)
    commit = source_commit()
    res: dict[str, Any] = {
        "device": device_name(device), "date": datetime.date.today().isoformat(),
        "commit": commit or "unknown", "torch": torch.__version__, "layouts": [dataclasses.asdict(x) for x in layouts],
        "tokens": tokens, "reps": a.reps,
        "copy_GBps": copy_bandwidth(device, (64 << 20) if a.tiny else (1 << 30)),
        "copy_GBps_events": copy_bandwidth_events(device, (64 << 20) if a.tiny else (1 << 30)),
        "targets": {"cuda_ipc_ratio_to_copy_8k": 0.80, "ttft_added_ratio_max": 0.03},
        "transfer": {}, "ttft": {},
    }
    print(f"copy bandwidth {res['copy_GBps']:.2f} GB/s on {res['device']}"
          f" (timed with events: {res['copy_GBps_events'] or 0:.2f})", flush=True)
    for backend in backends:
        try:
            for lay in layouts:  # the first layout's figures stay at the top level (older files)
                fig = bench_backend(backend, lay, tokens, a.reps, device, res["copy_GBps"], res["copy_GBps_events"])
                res["transfer"].setdefault(backend, dict(fig))[lay.model] = fig
            res["ttft"][backend] = bench_ttft(backend, model, ttft_tokens, a.reps, device,
                                              late_attach=a.late_attach and backend == "cuda_ipc")
        except (TransferError, RuntimeError, ValueError) as err:  # e.g. nccl on one GPU
            res["transfer"].setdefault(backend, {})["error"] = f"{type(err).__name__}: {err}"
            print(f"{backend}: {err}", flush=True)
    res.update(headline(res, layouts[0].model, str(max(tokens))))
    return res


def headline(res: dict[str, Any], model: str, tokens: str) -> dict[str, Any]:
    """The issue's top-level keys: cuda_ipc (else the first backend) GB/s and ratio on the first
    layout's longest prompt; TTFT added by the transfer with and without layer-wise overlap."""
    out: dict[str, Any] = {"gpu": res["device"]}
    ipc = res["transfer"].get("cuda_ipc", {}).get(model, {}).get(tokens)
    if ipc:  # the copy itself (device-timed); host-timed and end to end (attach and ack) beside it
        out["cuda_ipc_GBps"] = ipc.get("copy_phase_device_GBps", ipc["copy_phase_GBps"])
        out["cuda_ipc_bw_ratio"] = ipc.get("copy_phase_device_ratio_to_copy", ipc["copy_phase_ratio_to_copy"])
        out["cuda_ipc_host_timed_GBps"] = ipc["copy_phase_GBps"]
        out["cuda_ipc_host_timed_ratio"] = ipc["copy_phase_ratio_to_copy"]
        out["cuda_ipc_end_to_end_GBps"], out["cuda_ipc_end_to_end_ratio"] = ipc["GBps"], ipc["ratio_to_copy"]
        out["cuda_ipc_layerwise_GBps"] = ipc.get("layerwise_copy_phase_GBps")
        out["cuda_ipc_layerwise_ratio"] = ipc.get("layerwise_copy_phase_ratio_to_copy")
    for backend, ttft in res["ttft"].items():
        figs = {k: v for k, v in ttft.items() if isinstance(v, dict)}
        out.setdefault("overlap_added_ttft_ratio", {k: v["added_ratio"] for k, v in figs.items()})
        out.setdefault("no_overlap_added_ttft_ratio", {k: v["added_ratio_no_overlap"] for k, v in figs.items()})
        out.setdefault("ttft_backend", backend)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--backends", default="auto", help="comma list of tcp,nccl,cuda_ipc or auto")
    p.add_argument("--tokens", default="", help="prompt lengths (default 2048,8192; tiny 64,256)")
    p.add_argument("--ttft-tokens", default="", help="prompt lengths of the TTFT runs")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="a tiny layout and model (tests)")
    p.add_argument("--late-attach", action="store_true",
                   help="cuda_ipc TTFT: also a sender that attaches with its first push (A/B)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--role", default="sender", choices=["sender", "receiver"], help=argparse.SUPPRESS)
    p.add_argument("--layout", default="", help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.role == "receiver":
        asyncio.run(receiver_main(a.backends, KvLayout(**json.loads(a.layout)), a.blocks, torch.device(a.device)))
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown: gloo groups abort the process there
    torch.manual_seed(0)
    res = run(a)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
