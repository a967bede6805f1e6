"""`python -m gateway` / `pdserve gateway`: the public gRPC front door (and optional OpenAI HTTP)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.auth import ApiKeys
    from gateway.cors import Cors
    from gateway.hf_tokenizer import Tokenizer

log = logging.getLogger("gateway")
SERVICE = "pdserve-gateway"


def parser() -> argparse.ArgumentParser:
    from gateway import cors, procs
    from gateway.reasoning import PARSERS as REASONING_PARSERS
    from gateway.tools import PARSERS
    from pdserve.metrics import add_otlp_metrics_arg
    from pdserve.flags import add_model_args

    p = argparse.ArgumentParser(prog="pdserve gateway", description="pdserve gateway")
    add_model_args(p)
    add_otlp_metrics_arg(p)
    p.add_argument("--prefill", default="", help="prefill workers, host:port,...")
    p.add_argument("--decode", default="", help="decode workers, host:port,...")
    p.add_argument("--colocated", default="", help="colocated workers (prefill + decode in one), host:port,...")
    p.add_argument("--http-port", type=int, default=None, help="OpenAI-compatible HTTP port on --host (off when absent)")
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="requests waiting for their first token beyond which new ones get RESOURCE_EXHAUSTED / 429")
    p.add_argument("--queue-wait", type=float, default=30.0,
                   help="seconds a request waits for room in a full decode pool before RESOURCE_EXHAUSTED")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests may take to finish after SIGTERM")
    p.add_argument("--health-period", type=float, default=0.5, help="seconds between worker health/stats polls")
    p.add_argument("--health-warn-after", type=float, default=30.0,
                   help="log a WARNING for each worker not ready this many seconds after the gateway starts")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template to use instead of the model's (e.g. gateway/templates/chatml_tools.jinja, "
                        "ChatML that shows tools and tool calls in the Hermes format)")
    p.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                   help="read tool calls out of the text, enabling tool_choice \"auto\" on the OpenAI face")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
                   help="sampling defaults for requests that leave them unset (vLLM's): auto, the model's "
                        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
                        "max_new_tokens); vllm, the built-in ones; or a folder's generation_config.json")
    p.add_argument("--reasoning-parser", choices=REASONING_PARSERS, default=None,
                   help="answer a thinking model's <think>...</think> as `reasoning` apart from the content "
                        "(OpenAI face, chat)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require `Authorization: Bearer KEY` on the HTTP face (all but /health, /ping, /version, "
                        "/metrics) and `authorization: Bearer KEY` metadata on pdserve.v1.Gateway; repeat to accept "
                        "several keys (rotation). Absent: PDSERVE_API_KEY, else VLLM_API_KEY, else no key. A flag "
                        "shows in `ps`: prefer the variable")
    cors.add_args(p)
    procs.add_args(p)
    return p


def access(args: argparse.Namespace) -> tuple[ApiKeys, Cors | None]:
    """(ApiKeys, Cors or None) from the flags and the environment; SystemExit names a bad one."""
    from gateway.auth import ApiKeys
    from gateway.cors import Cors
    from pdserve import api_keys

    try:
        return ApiKeys(api_keys.resolve(args.api_key, os.environ)), Cors.from_args(args)
    except ValueError as e:
        raise SystemExit(f"pdserve gateway: {e}")


def build(args: argparse.Namespace):
    """The Generation path and Router from the flags (model folder, tokenizer, worker lists)."""
    from gateway import sampling_defaults
    from gateway.admission import Admission
    from gateway.generation import Generation, ModelInfo
    from gateway.router import Router
    from pdserve.guided import GuideCompiler
    from pdserve.model.prepare import resolve_model
    from pdserve.model.spec import ModelSpec

    model_dir = resolve_model(args.model, require_weights=False)  # config + tokenizer only
    spec = ModelSpec.from_dir(model_dir)
    try:
        defaults = sampling_defaults.load(args.generation_config, model_dir)
    except ValueError as e:
        raise SystemExit(f"pdserve gateway: --generation-config {args.generation_config}: {e}")
    info = ModelInfo(args.served_model_name or model_dir.name, args.max_model_len, spec.vocab_size,
                     spec.eos_token_ids, tuple(defaults.items()))
    split = lambda s: [a for a in s.split(",") if a]  # noqa: E731
    try:
        router = Router(split(args.prefill), split(args.decode), split(args.colocated))
    except ValueError as e:
        raise SystemExit(f"pdserve gateway: {e} (--prefill/--decode or --colocated)")
    router.queue_wait_s = args.queue_wait
    guides = GuideCompiler.for_model(model_dir, spec.eos_token_ids)
    return Generation(info, tokenizer(model_dir, args.chat_template), router, Admission(args.max_queued_requests),
                      guides), router


def tokenizer(model_dir: Path, chat_template: str | None) -> Tokenizer:
    """The model's tokenizer, with the --chat-template file's template instead of its own if given."""
    from gateway.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    if chat_template:
        try:
            tok.chat_template = Path(chat_template).read_text()
        except OSError as e:
            raise SystemExit(f"pdserve gateway: --chat-template {chat_template}: {e.strerror}")
    return tok


async def amain(args: argparse.Namespace) -> None:
    from grpc_reflection.v1alpha import reflection

    from gateway.auth import GrpcKeyCheck
    from gateway.health import Monitor
    from gateway.openai_http import OpenAIServer
    from gateway.server import GatewayService, add_to_server
    from pdserve import metrics, serving

    keys, cors = access(args)
    names = ["pdserve.v1.Gateway"]
    generation, router = build(args)
    monitor = Monitor(router, period_s=args.health_period, warn_after_s=args.health_warn_after)
    monitor.start()
    shared = args.proc_index is not None  # one of --num-procs processes on the same ports
    server = serving.new_server(reuse_port=shared, interceptors=[GrpcKeyCheck(keys, names)] if keys else [])
    gateway_metrics = metrics.GatewayMetrics()
    metrics.serve(args.metrics_port, gateway_metrics.registry, args.host)
    otlp = metrics.export_otlp(args.otlp_metrics_endpoint, gateway_metrics.registry, SERVICE)
    add_to_server(GatewayService(generation, gateway_metrics), server)
    http = OpenAIServer(generation, gateway_metrics, tool_parser=args.tool_call_parser,
                        reasoning_parser=args.reasoning_parser, api_keys=keys, cors=cors)
    health = serving.add_health(server, names)
    reflection.enable_server_reflection([*names, "grpc.health.v1.Health", reflection.SERVICE_NAME], server)

    async def on_start() -> None:
        if args.http_port is not None:
            await http.start(args.host, args.http_port, reuse_port=shared)
        # Everything built so far (grpc, the tokenizer, llguidance, numpy) lives until exit;
        # frozen, full collections stop walking it (a py-spy profile at 500 streams had the
        # collector at ~11% of the gateway's samples before, ~7% after).
        gc.collect()
        gc.freeze()

    async def drain() -> None:
        if not await generation.admission.drain(args.drain_timeout):
            log.warning("drain timeout: %d requests still in flight", generation.admission.active)

    async def on_stop() -> None:
        log.info("gateway process %s (pid %d) served %d requests", args.proc_index or 0, os.getpid(),
                 generation.admission.admitted)
        await http.stop()
        await monitor.stop()
        await router.close()
        if otlp is not None:  # the last snapshot, after the drain
            otlp.shutdown()

    await serving.serve(server, f"{args.host}:{args.port}", health, names, on_stop=on_stop,
                        drain_seconds=1.0, on_start=on_start, drain=drain)


def main(argv: list[str] | None = None) -> None:
    from gateway import procs
    from pdserve.serving import run_service, setup_logging

    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    procs.check_args(args)
    access(args)  # a bad key or CORS flag stops every process before any starts
    if procs.is_child(args):
        procs.child_setup(args)
    elif args.num_procs > 1:
        setup_logging(args.log_level)
        sys.exit(procs.supervise(args, argv, SERVICE))
    run_service(args, amain, SERVICE)


if __name__ == "__main__":
    main(sys.argv[1:])
