"""The `pdserve` command: up | gateway | prefill | decode | generate | bench | prepare-model."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

DEMO_QUESTION = "What is the capital of France?"


def _up_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pdserve up", description="gateway + prefill + decode on 127.0.0.1")
    p.add_argument("--colocated", action="store_true", help="one worker runs prefill and decode (no KV transfer)")
    p.add_argument("--model", default=None)
    p.add_argument("--port", type=int, default=50051, help="gateway port")
    p.add_argument("--gateway-procs", default="1", help="the gateway's --num-procs")
    p.add_argument("--demo", action="store_true", help=f"ask {DEMO_QUESTION!r} once everything is up")
    p.add_argument("--quiet", action="store_true", help="do not echo the services' logs")
    p.add_argument("--speculative-config", default=None,
                   help="JSON for the decode (or colocated) worker, e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 4}'")
    p.add_argument("--http-port", type=int, default=None, help="the gateway's OpenAI-compatible HTTP port (off when absent)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="the gateway's chat template instead of the model's")
    p.add_argument("--tool-call-parser", default=None, help="the gateway's tool-call parser (hermes, llama3_json, mistral): tool_choice \"auto\"")
    p.add_argument("--reasoning-parser", default=None, help="the gateway's reasoning parser (deepseek_r1, qwen3)")
    p.add_argument("--generation-config", default=None, help="the gateway's sampling defaults: auto (the model's), "
                                                             "vllm or a folder")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="the gateway's --api-key (repeatable); else it reads PDSERVE_API_KEY or VLLM_API_KEY")
    p.add_argument("--allowed-origins", default=None, metavar="JSON", help="the gateway's CORS origins (off when absent)")
    return p


def _up(argv: list[str]) -> None:
    args, worker_args = _up_parser().parse_known_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the services too, like Ctrl-C
    from pdserve.launch import Stack
    from pdserve.model.prepare import resolve_model

    model = resolve_model(args.model)  # prepares the default model once, with a progress bar
    print(f"starting {'a colocated worker' if args.colocated else 'prefill, decode'} and gateway ...", flush=True)
    decode_args = ["--speculative-config", args.speculative_config] if args.speculative_config else []
    stack = Stack(model=str(model), worker_args=worker_args, echo=not args.quiet, colocated=args.colocated,
                  decode_args=decode_args, gateway_args=_gateway_args(args))
    stack.start(gateway_port=args.port)
    try:
        for name, proc in stack.procs.items():
            print(f"  {name:8s} {proc.address}")
        if args.http_port is not None:
            print(f"  {'openai':8s} http://127.0.0.1:{args.http_port}/v1")
        if args.demo:
            _stream(stack.gateway, (args.api_key or [None])[0], messages=[("user", DEMO_QUESTION)], max_tokens=64,
                    temperature=0.0)
        print(f"serving on {stack.gateway}; try: pdserve generate --address {stack.gateway} \"Hello\"")
        print("Ctrl-C to stop", flush=True)
        while all(pr.popen.poll() is None for pr in stack.procs.values()):
            time.sleep(0.5)
        print("a service exited; stopping", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()


def _gateway_args(args: argparse.Namespace) -> list[str]:
    """The gateway's flags from `pdserve up`'s. A key from PDSERVE_API_KEY stays in the environment,
    which the gateway inherits: only keys given as flags (already in `ps`) go on its command line."""
    out = ["--num-procs", args.gateway_procs]
    for flag, value in (("--http-port", args.http_port), ("--chat-template", args.chat_template),
                        ("--tool-call-parser", args.tool_call_parser), ("--reasoning-parser", args.reasoning_parser),
                        ("--generation-config", args.generation_config), ("--allowed-origins", args.allowed_origins)):
        out += [flag, str(value)] if value is not None else []
    for key in args.api_key or ():
        out += ["--api-key", key]
    return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stream(address: str, api_key: str | None, **kw: object) -> None:
    """Print the text as it comes, then the finish; with logprobs, a line per token after it
    (with prompt logprobs, first a line per prompt token after the first, marked `prompt`).
    api_key None: the environment's (pdserve.client.Client)."""
    from pdserve.client import Client, build_request

    entries, prompt = [], []
    with Client(address, api_key=api_key) as client:
        for msg in client.stream(build_request(**kw)):
            if msg.HasField("chunk"):
                print(msg.chunk.text, end="", flush=True)
                entries.extend(zip(msg.chunk.token_ids, msg.chunk.logprobs))
                prompt.extend(zip(msg.chunk.prompt_token_ids[1:], msg.chunk.prompt_logprobs))
            else:
                c = msg.complete
                reason = {1: "stop", 2: "length", 3: "abort"}.get(c.finish_reason, "?")
                print(f"\n[finish={reason} prompt_tokens={c.usage.prompt_tokens} "
                      f"completion_tokens={c.usage.completion_tokens}]")
    for mark, (token, lp) in [("prompt\t", e) for e in prompt] + [("", e) for e in entries]:
        top = " ".join(f"{t}:{v:.3f}" for t, v in zip(lp.top_token_ids, lp.top_logprobs))
        print(f"{mark}{token}\t{lp.logprob:.4f}" + (f"\t{top}" if top else ""))


def _generate(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="pdserve generate", description="stream a completion from a gateway")
    p.add_argument("prompt")
    p.add_argument("--address", default="127.0.0.1:50051")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="sent as `authorization: Bearer KEY` (a gateway with --api-key); "
                        "default: PDSERVE_API_KEY, else VLLM_API_KEY")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user chat message")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--priority", type=int, default=None, help="scheduling priority: lower runs first (default 0)")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="after the text, each token's id and logprob and its N most likely alternatives")
    p.add_argument("--prompt-logprobs", type=int, default=None, metavar="N",
                   help="the same for each prompt token after the first (lines marked `prompt`)")
    guide = p.add_mutually_exclusive_group()
    guide.add_argument("--json-schema", default=None, metavar="JSON",
                       help="structured output: JSON that this schema (JSON text, or @file) accepts")
    guide.add_argument("--json-object", action="store_true", help="structured output: any JSON object")
    guide.add_argument("--regex", default=None, help="structured output: text the regex matches whole")
    guide.add_argument("--choice", action="append", default=None, help="structured output: one of these (repeat)")
    guide.add_argument("--grammar", default=None, metavar="LARK", help="structured output: a Lark grammar (or @file)")
    a = p.parse_args(argv)
    optional = dict(top_p=a.top_p, top_k=a.top_k, seed=a.seed, min_p=a.min_p, presence_penalty=a.presence_penalty,
                    frequency_penalty=a.frequency_penalty, repetition_penalty=a.repetition_penalty,
                    logprobs=a.logprobs, prompt_logprobs=a.prompt_logprobs, priority=a.priority)
    kw = {k: v for k, v in optional.items() if v is not None}
    structured = _structured_output(a)
    if structured is not None:
        kw["structured_output"] = structured
    prompt = {"messages": [("user", a.prompt)]} if a.chat else {"text": a.prompt}
    import grpc

    from pdserve import api_keys

    try:  # a bad key stops here, naming the flag or the variable
        api_keys.check_key(a.api_key, "--api-key") if a.api_key is not None else api_keys.from_env(os.environ)
    except ValueError as e:
        raise SystemExit(f"pdserve generate: {e}")
    try:
        _stream(a.address, a.api_key, max_tokens=a.max_tokens, temperature=a.temperature, stop=a.stop, **prompt, **kw)
    except grpc.RpcError as e:
        raise SystemExit(f"error: {e.code().name}: {e.details()}")


def _structured_output(a: argparse.Namespace):
    """The StructuredOutput the flags ask for (None: free text); `@path` reads a file."""
    from pdserve.proto import gateway_pb2

    text = lambda v: open(v[1:], encoding="utf-8").read() if v.startswith("@") else v  # noqa: E731
    if a.json_schema is not None:
        return gateway_pb2.StructuredOutput(json_schema=text(a.json_schema))
    if a.json_object:
        return gateway_pb2.StructuredOutput(json_object=True)
    if a.regex is not None:
        return gateway_pb2.StructuredOutput(regex=a.regex)
    if a.choice:
        return gateway_pb2.StructuredOutput(choice=gateway_pb2.Choices(choices=a.choice))
    if a.grammar is not None:
        return gateway_pb2.StructuredOutput(grammar=text(a.grammar))
    return None


def _prepare(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="pdserve prepare-model", description="prepare the default model")
    p.add_argument("--model", default=None, help="an HF folder to check instead of the default model")
    a = p.parse_args(argv)
    from pdserve.model.prepare import resolve_model

    print(resolve_model(a.model))


def _bench(argv: list[str]) -> None:
    from pdserve.bench.main import main as bench_main

    bench_main(argv)


def _service(module: str):
    def run(argv: list[str]) -> None:
        import importlib

        importlib.import_module(f"{module}.__main__").main(argv)

    return run


COMMANDS = {
    "up": _up,
    "gateway": _service("gateway"),
    "prefill": _service("prefill_service"),
    "decode": _service("decode_service"),
    "generate": _generate,
    "bench": _bench,
    "prepare-model": _prepare,
}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: pdserve {{{'|'.join(COMMANDS)}}} [options]   (pdserve CMD --help)", file=sys.stderr)
        raise SystemExit(2)
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
