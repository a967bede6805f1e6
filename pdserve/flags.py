"""The flags every pdserve service takes (model folder, address, logging, metrics): torch-free, so
the gateway's parser costs nothing; the workers add theirs in pdserve.worker.add_worker_args."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--otlp-traces-endpoint", default=None,
                   help="OTLP/gRPC collector for traces, e.g. http://jaeger:4317 (else OTEL_* env vars)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus endpoint port (0: off)")
