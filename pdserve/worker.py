"""What the prefill, decode and colocated workers share: flags, and building runner + scheduler."""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from pdserve.core.block_manager import BlockManager
from pdserve.core.scheduler import Scheduler, SchedulerConfig
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.speculative import SpeculativeConfig
from pdserve.flags import add_model_args
from pdserve.guided import GuideCompiler
from pdserve.model.llama import weight_shapes
from pdserve.model.prepare import resolve_model
from pdserve.model.spec import ModelSpec
from pdserve.runtime.draft_model import DraftModelProposer, check_draft_model
from pdserve.runtime.kv_cache import block_bytes
from pdserve.runtime.kv_quant import KV_CACHE_DTYPES, is_quantized, quant_block_bytes
from pdserve.runtime.penalties import PenaltyCounts
from pdserve.runtime.runner import ModelRunner

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _kv_cache_dtype(value: str) -> str:
    """vLLM's `--kv-cache-dtype fp8` means e4m3 on NVIDIA GPUs; so here."""
    return "fp8_e4m3" if value == "fp8" else value


def add_worker_args(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="auto", choices=["auto", *_DTYPES])
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--kv-cache-memory", type=int, default=512 << 20, help="KV pool bytes (CPU)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--num-blocks", type=int, default=None, help="override the pool size in blocks")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="decode worker: apply each step's tokens before planning the next (no CPU/GPU overlap)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES), type=_kv_cache_dtype,
                   help="KV pool storage: auto (= --dtype), fp8_e4m3 (or fp8, as vLLM spells it) or int8 "
                        "with per-token scales")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--kv-transfer", default="tcp", choices=["tcp", "cuda_ipc", "nccl"])
    p.add_argument("--advertise-host", default=None,
                   help="host other workers use to reach this one (default --host; set it when binding 0.0.0.0)")
    p.add_argument("--seed", type=int, default=0)


@dataclass
class Built:
    spec: ModelSpec
    runner: ModelRunner
    scheduler: Scheduler
    model_name: str
    guides: GuideCompiler | None = None  # structured output (None: the model has no tokenizer.json)


def build(args: argparse.Namespace) -> Built:
    """Load the model, size the KV pool and make the scheduler over it."""
    dummy = args.load_format == "dummy"
    model_dir = resolve_model(args.model, require_weights=not dummy) if not dummy or args.model else None
    if model_dir is None:
        raise SystemExit("--load-format dummy needs --model pointing at a folder with config.json")
    spec = ModelSpec.from_dir(model_dir)
    if args.max_model_len > spec.max_position_embeddings:
        raise SystemExit(
            f"--max-model-len {args.max_model_len} exceeds the model's {spec.max_position_embeddings}"
        )
    device = torch.device(args.device)
    dtype = _pick_dtype(args.dtype, device)
    spec_cfg = getattr(args, "speculative_config", None)  # decode and colocated workers only
    draft_dir, draft_spec = _draft_model(spec_cfg, spec, args)
    num_blocks = args.num_blocks or _num_blocks(args, spec, dtype, device, draft_spec)
    runner = ModelRunner(
        spec, model_dir, device=device, dtype=dtype, num_blocks=num_blocks,
        block_size=args.block_size, load_format=args.load_format, seed=args.seed,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        enforce_eager=getattr(args, "enforce_eager", False),
        kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto"),
    )
    _warm_up(runner, "model")
    cfg = SchedulerConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(args.max_num_batched_tokens, args.block_size),
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    # The layout hash salts the prefix hashes: equal on every worker whose KV is interchangeable.
    salt = int(runner.layout.compat_hash(), 16)
    planner = None
    if spec_cfg is not None:
        proposer = None
        if draft_spec is not None:  # its own runner and pool, as many blocks as the target's
            draft = ModelRunner(
                draft_spec, draft_dir, device=device, dtype=dtype, num_blocks=num_blocks,
                block_size=args.block_size, load_format=args.load_format, seed=args.seed + 1,
                max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                enforce_eager=getattr(args, "enforce_eager", False),
            )
            _warm_up(draft, "draft model")
            proposer = DraftModelProposer(draft, spec.vocab_size)
        planner = DraftPlanner(spec_cfg, args.max_model_len, proposer=proposer)
    guides = GuideCompiler.for_model(model_dir, spec.eos_token_ids)
    sched = Scheduler(cfg, BlockManager(num_blocks, args.block_size, salt=salt), planner,
                      guides.masks if guides is not None else None)
    name = args.served_model_name or model_dir.name
    log.info("model %s: %d KV blocks of %d tokens on %s/%s", name, num_blocks, args.block_size, device, dtype)
    return Built(spec, runner, sched, name, guides)


def _warm_up(runner: ModelRunner, what: str) -> None:
    """On CUDA, compile the eager path's kernels before the first request (ModelRunner.warm_up)."""
    if runner.device.type != "cuda":
        return
    t0 = time.perf_counter()
    runner.warm_up()
    log.info("%s warm-up (eager kernels compiled or loaded): %.1f s", what, time.perf_counter() - t0)


def _draft_model(spec_cfg: SpeculativeConfig | None, target: ModelSpec, args: argparse.Namespace
                 ) -> tuple[Path | None, ModelSpec | None]:
    """The draft model's folder and spec for method draft_model (SystemExit naming the key when
    it cannot serve: no folder, another tokenizer's vocabulary, a shorter context)."""
    if spec_cfg is None or spec_cfg.method != "draft_model":
        return None, None
    try:
        folder = resolve_model(spec_cfg.model, require_weights=args.load_format != "dummy")
    except ValueError as err:
        raise SystemExit(f"--speculative-config model: {err}") from None
    draft = ModelSpec.from_dir(folder)
    try:  # before any weight is loaded
        check_draft_model(draft, target.vocab_size, args.max_model_len)
    except ValueError as err:
        raise SystemExit(f"{err} ({spec_cfg.model})") from None
    return folder, draft


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def _num_blocks(args: argparse.Namespace, spec: ModelSpec, dtype: torch.dtype, device: torch.device,
                draft: ModelSpec | None = None) -> int:
    """KV blocks in the memory budget; a draft model's weights and a block of its pool per
    target block come out of the same budget."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        weights = _weight_bytes(spec, dtype) + (_weight_bytes(draft, dtype) if draft is not None else 0)
        # --gpu-memory-utilization is this worker's share of the whole GPU (as in vLLM), so two
        # workers can share one GPU at 0.45 each; never more than what is actually free.
        own = int(total * args.gpu_memory_utilization) - weights - (2 << 30)
        # the penalties' counts are allocated later, by the first penalized request
        budget = min(own, free - weights - (1 << 30)) - PenaltyCounts.nbytes(args.max_num_seqs, spec.vocab_size)
    else:
        budget = args.kv_cache_memory
    kv_dtype = getattr(args, "kv_cache_dtype", "auto")
    per_block = (quant_block_bytes(spec, args.block_size) if is_quantized(kv_dtype)
                 else block_bytes(spec, args.block_size, dtype))
    if draft is not None:
        per_block += block_bytes(draft, args.block_size, dtype)
    n = max(0, budget // per_block)
    if n <= 0:
        raise SystemExit("no memory left for the KV cache: raise --kv-cache-memory / --gpu-memory-utilization")
    return n


def _weight_bytes(spec: ModelSpec, dtype: torch.dtype) -> int:
    """Bytes of the weights the model will hold (a mixture of experts' every expert counted)."""
    shapes = weight_shapes(spec)
    if spec.tie_word_embeddings:
        del shapes["lm_head"]
    return sum(math.prod(s) for s in shapes.values()) * (torch.finfo(dtype).bits // 8)
