"""`python -m gateway` / `pdserve gateway`: the public gRPC front door."""

from __future__ import annotations

import argparse
import asyncio
import sys


def parser() -> argparse.ArgumentParser:
    from pdserve.worker import add_model_args

    p = argparse.ArgumentParser(prog="pdserve gateway", description="pdserve gateway")
    add_model_args(p)
    p.add_argument("--prefill", default="", help="prefill workers, host:port,...")
    p.add_argument("--decode", default="", help="decode workers, host:port,...")
    p.add_argument("--colocated", default="", help="colocated workers (prefill + decode in one), host:port,...")
    return p


async def amain(args: argparse.Namespace) -> None:
    from grpc_reflection.v1alpha import reflection

    from gateway.router import Router
    from gateway.server import GatewayService, ModelInfo, add_to_server
    from gateway.tokenizer import load_tokenizer
    from pdserve import metrics, serving
    from pdserve.model.prepare import resolve_model
    from pdserve.model.spec import ModelSpec

    model_dir = resolve_model(args.model)
    spec = ModelSpec.from_dir(model_dir)
    tok = load_tokenizer(model_dir)
    info = ModelInfo(args.served_model_name or model_dir.name, args.max_model_len,
                     spec.vocab_size, spec.eos_token_ids)
    split = lambda s: [a for a in s.split(",") if a]  # noqa: E731
    try:
        router = Router(split(args.prefill), split(args.decode), split(args.colocated))
    except ValueError as e:
        raise SystemExit(f"pdserve gateway: {e} (--prefill/--decode or --colocated)")
    server = serving.new_server()
    gateway_metrics = metrics.GatewayMetrics()
    metrics.serve(args.metrics_port, gateway_metrics.registry, args.host)
    add_to_server(GatewayService(info, tok, router, gateway_metrics), server)
    names = ["pdserve.v1.Gateway"]
    health = serving.add_health(server, names)
    reflection.enable_server_reflection([*names, "grpc.health.v1.Health", reflection.SERVICE_NAME], server)
    await serving.serve(server, f"{args.host}:{args.port}", health, names, on_stop=router.close)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    from pdserve.serving import setup_logging, setup_observability

    setup_logging(args.log_level)
    setup_observability(args, "pdserve-gateway")
    asyncio.run(amain(args))


if __name__ == "__main__":
    main(sys.argv[1:])
