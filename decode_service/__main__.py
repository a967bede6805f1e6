"""`python -m decode_service` / `pdserve decode`: a decode worker."""

from __future__ import annotations

import argparse
import asyncio
import sys

from pdserve.proto import worker_pb2_grpc

SERVICE = "pdserve-decode"


def parser() -> argparse.ArgumentParser:
    from pdserve.metrics import add_otlp_metrics_arg
    from pdserve.worker import add_worker_args

    p = argparse.ArgumentParser(prog="pdserve decode", description="pdserve decode worker")
    add_worker_args(p)
    add_otlp_metrics_arg(p)
    p.add_argument("--kv-nccl-port", type=int, default=0, help="nccl: the TCPStore port prefill workers rendezvous at (0: any free)")
    p.add_argument("--lease-ms", type=int, default=10_000, help="reservation lease")
    p.add_argument("--role", default="decode", choices=["decode", "colocated"],
                   help="colocated: serve whole requests (Generate) as well; only the reported role differs")
    p.add_argument("--speculative-config", type=_speculative_config, default=None,
                   help='JSON, as vLLM: \'{"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_max": 4, "prompt_lookup_min": 1}\' (off when absent)')
    return p


def _speculative_config(text: str):
    from pdserve.core.speculative import SpeculativeConfig

    try:
        return SpeculativeConfig.parse(text)
    except ValueError as e:  # argparse names the flag itself
        raise argparse.ArgumentTypeError(str(e).removeprefix("--speculative-config: ")) from None


async def amain(args: argparse.Namespace) -> None:
    from decode_service.engine import DecodeEngine
    from decode_service.server import DecodeServicer, lease_reaper
    from pdserve import serving
    from pdserve.runtime.loop import EngineLoop
    from pdserve.worker import build

    built = build(args)
    from pdserve.runtime.spec_step import SpeculativeRunner

    spec = built.scheduler.spec
    runner = SpeculativeRunner(built.runner, spec.cfg.num_speculative_tokens) if spec is not None else built.runner
    loop = EngineLoop(built.scheduler, runner, overlap=args.overlap)
    from pdserve.transfer import make_receiver

    kw = {"host": args.advertise_host or args.host, "port": args.kv_nccl_port} if args.kv_transfer == "nccl" else {}
    receiver = make_receiver(args.kv_transfer, built.runner.kv_pool, built.runner.layout, **kw)
    engine = DecodeEngine(loop, receiver, built.spec.eos_token_ids, args.lease_ms / 1000, built.guides)
    address = f"{args.host}:{args.port}"
    server = serving.new_server()
    kv_address = f"{args.advertise_host or args.host}:{args.port}"  # where prefill workers send KV
    kv_address = getattr(receiver, "kv_address", kv_address)  # nccl: its TCPStore
    servicer = DecodeServicer(engine, built.runner.layout, kv_address, args.kv_transfer, built.model_name, args.role,
                              built.spec.vocab_size)
    worker_pb2_grpc.add_DecodeWorkerServicer_to_server(servicer, server)
    from pdserve.metrics import export_otlp, serve_worker

    from decode_service.kv_metrics import ReceivedKvCollector

    worker_metrics = serve_worker(args.metrics_port, loop, lambda: engine.num_reserved, host=args.host)
    worker_metrics.registry.register(ReceivedKvCollector(engine))
    otlp = export_otlp(args.otlp_metrics_endpoint, worker_metrics.registry, SERVICE)
    if hasattr(receiver, "add_to_server"):  # tcp, cuda_ipc: the KvTransfer service
        receiver.add_to_server(server)
    names = ["pdserve.v1.DecodeWorker", "pdserve.v1.KvTransfer"]
    health = serving.add_health(server, names)
    loop.start()
    reaper = asyncio.create_task(lease_reaper(engine))

    async def stop() -> None:
        reaper.cancel()
        loop.stop()
        if hasattr(receiver, "close"):  # nccl: drop process groups before the interpreter exits
            receiver.close()
        if otlp is not None:  # the last snapshot, after the drain
            otlp.shutdown()

    await serving.serve(server, address, health, names, on_stop=stop)


def main(argv: list[str] | None = None) -> None:
    from pdserve.serving import run_service

    run_service(parser().parse_args(argv), amain, SERVICE)


if __name__ == "__main__":
    main(sys.argv[1:])
