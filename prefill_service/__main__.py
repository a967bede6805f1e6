"""`python -m prefill_service` / `pdserve prefill`: a prefill worker."""

from __future__ import annotations

import argparse
import sys

SERVICE = "pdserve-prefill"


def parser() -> argparse.ArgumentParser:
    from pdserve.metrics import add_otlp_metrics_arg
    from pdserve.worker import add_worker_args

    p = argparse.ArgumentParser(prog="pdserve prefill", description="pdserve prefill worker")
    add_worker_args(p)
    add_otlp_metrics_arg(p)
    return p


async def amain(args: argparse.Namespace) -> None:
    from pdserve import serving
    from pdserve.proto import worker_pb2_grpc
    from pdserve.runtime.loop import EngineLoop
    from pdserve.transfer import make_sender
    from pdserve.worker import build
    from prefill_service.engine import PrefillEngine
    from prefill_service.server import PrefillServicer

    built = build(args)
    if args.kv_transfer == "cuda_ipc" and not built.runner.kv_pool.is_cuda:
        raise SystemExit(f"--kv-transfer cuda_ipc needs the KV pool on CUDA; it is on {built.runner.kv_pool.device}")
    sender = make_sender(args.kv_transfer, built.runner.layout)
    engine = PrefillEngine(sender, built.spec.eos_token_ids, built.guides)
    # compute-bound steps: nothing to hide, and each step's KV pushes finish before the next
    loop = EngineLoop(built.scheduler, built.runner, hook_for_step=engine.hook_for_step, overlap=False)
    engine.attach(loop)
    server = serving.new_server()
    servicer = PrefillServicer(engine, built.runner.layout, built.spec.vocab_size, built.model_name)
    worker_pb2_grpc.add_PrefillWorkerServicer_to_server(servicer, server)
    from pdserve.metrics import export_otlp, serve_worker

    servicer.metrics = serve_worker(args.metrics_port, loop, host=args.host)
    otlp = export_otlp(args.otlp_metrics_endpoint, servicer.metrics.registry, SERVICE)
    names = ["pdserve.v1.PrefillWorker"]
    health = serving.add_health(server, names)
    loop.start()

    async def stop() -> None:
        loop.stop()
        sender.close()
        if otlp is not None:  # the last snapshot, after the drain
            otlp.shutdown()

    await serving.serve(server, f"{args.host}:{args.port}", health, names, on_stop=stop)


def main(argv: list[str] | None = None) -> None:
    from pdserve.serving import run_service

    run_service(parser().parse_args(argv), amain, SERVICE)


if __name__ == "__main__":
    main(sys.argv[1:])
