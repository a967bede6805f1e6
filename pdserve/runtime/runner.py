"""ModelRunner: StepInput -> tensors -> one forward over the paged pool -> sampled tokens."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from pdserve.core.kv_layout import KvLayout
from pdserve.core.sampling import SamplingParams
from pdserve.core.step_io import PLACEHOLDER, History, SeqSlice, StepInput, StepOutput
from pdserve.model.llama import AttnMetadata, LayerHook, LlamaModel
from pdserve.model.loader import load_weights
from pdserve.model.spec import ModelSpec
from pdserve.runtime.cuda_graph import DecodeGraphs
from pdserve.runtime.kv_cache import allocate_kv_pool, kv_layout
from pdserve.runtime.kv_quant import allocate_quant_pool, is_quantized, quant_kv_layout
from pdserve.runtime.penalties import PenaltyCounts, process
from pdserve.runtime.prompt_logprobs import QueuedPromptLogprobs, prompt_rows, queue_prompt_logprobs
from pdserve.runtime.sampler import TRITON_NUCLEUS_MIN_ROWS, QueuedLogprobs, queue_logprobs, sample_on_device, to_device
from pdserve.runtime.staging import HostStager, check_block_ids, flat_slot_mapping, fill_placeholders


def default_ops(device: str | torch.device) -> ModuleType:
    """pdserve.kernels.reference on CPU, pdserve.kernels.triton_ops on CUDA (same function names)."""
    name = "pdserve.kernels.triton_ops" if torch.device(device).type == "cuda" else "pdserve.kernels.reference"
    return importlib.import_module(name)


@dataclass
class LaunchedStep:
    """A step whose forward and sampling are queued on the device; `result` waits for them."""

    request_ids: list[str]  # of the slices that sample, in order
    tokens: torch.Tensor  # their tokens: a pinned host tensor filled by a queued copy (CUDA)
    done: torch.cuda.Event | None
    logprobs: QueuedLogprobs | None = None  # of the slices whose params ask for them (host)
    prompt_logprobs: QueuedPromptLogprobs | None = None  # of the slices with prompt targets (host)

    def result(self) -> StepOutput:
        if self.done is not None:
            self.done.synchronize()
        sampled = dict(zip(self.request_ids, self.tokens.tolist()))
        prompt = self.prompt_logprobs.by_request() if self.prompt_logprobs is not None else {}
        if self.logprobs is None:
            return StepOutput(sampled=sampled, prompt_logprobs=prompt)
        ids = [self.request_ids[r] for r in self.logprobs.rows]
        return StepOutput(sampled=sampled, logprobs=dict(zip(ids, self.logprobs.entries())), prompt_logprobs=prompt)


@dataclass
class PendingSampling:
    """A step whose forward is queued and whose sampling waits for the masks of its guided
    slices (SeqSlice.mask_pending): `give_masks` queues the sampling, then `result` waits as
    LaunchedStep's does. The runner launches nothing else until the masks are given."""

    runner: ModelRunner
    ids: list[str]
    sampled: list[SeqSlice]
    logits: torch.Tensor | None
    prompt: QueuedPromptLogprobs | None
    launched: LaunchedStep | None = None
    needs_masks: bool = True

    def give_masks(self, masks: dict[str, bytes]) -> None:
        """Queue the sampling; masks[request id] for each mask_pending slice (absent: no mask,
        for a request that ended meanwhile and whose token will be dropped)."""
        allowed = [masks.get(s.request_id) if s.mask_pending else s.allowed for s in self.sampled]
        try:
            with torch.inference_mode():
                self.launched = self.runner._sample(self.ids, self.sampled, self.logits, self.prompt, allowed)
        finally:  # even failed, it no longer holds the runner up
            self.logits, self.needs_masks = None, False

    def result(self) -> StepOutput:
        if self.launched is None:
            raise RuntimeError("the step's masks were never given; it sampled nothing")
        return self.launched.result()


class ModelRunner:
    """Owns the weights, the KV pool and a sampler generator of one worker.

    On CUDA, pure-decode steps of up to `max_num_seqs` sequences replay CUDA graphs captured
    at start-up (tables as wide as `max_model_len` needs); `enforce_eager` turns them off.
    """

    def __init__(
        self,
        spec: ModelSpec,
        model_dir: str | Path | None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        num_blocks: int,
        block_size: int = 16,
        load_format: str = "auto",
        seed: int = 0,
        ops: ModuleType | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int = 256,
        enforce_eager: bool = False,
        kv_cache_dtype: str = "auto",
    ) -> None:
        self.spec = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        weights = load_weights(
            spec, model_dir, device=self.device, dtype=dtype, load_format=load_format, seed=seed
        )
        self.model = LlamaModel(spec, weights, ops or default_ops(self.device))
        if is_quantized(kv_cache_dtype):  # fp8/int8 rows with their scales (runtime/kv_quant.py)
            self.kv_pool = allocate_quant_pool(spec, num_blocks, block_size, kv_cache_dtype, self.device)
            self.layout: KvLayout = quant_kv_layout(spec, block_size, kv_cache_dtype)
        else:
            self.kv_pool = allocate_kv_pool(spec, num_blocks, block_size, dtype, self.device)
            self.layout = kv_layout(spec, block_size, dtype)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.max_model_len = min(max_model_len or self.model.max_position, self.model.max_position)
        self._stager = HostStager(self.device)
        # the last launched step's sampled tokens (device), read by its successor's placeholders
        self.prev_tokens = torch.zeros(max(1, max_num_seqs), dtype=torch.int32, device=self.device)
        self._prev_ids: list[str] = []
        self._awaiting: PendingSampling | None = None  # a launched step waiting for its masks
        self.penalty_counts = PenaltyCounts(spec.vocab_size, self.device, max(1, max_num_seqs))
        self.graphs: DecodeGraphs | None = None
        if self.device.type == "cuda" and not enforce_eager:
            self.graphs = DecodeGraphs(
                self.model, self.kv_pool, block_size=block_size,
                max_model_len=self.max_model_len, max_num_seqs=max_num_seqs, prev_tokens=self.prev_tokens,
            )

    def warm_up(self) -> None:
        """Run the kernels of eager steps once, so that Triton compiles them now rather than
        inside the first requests' steps (a compile takes ~0.1-1 s): a one-prompt prefill, a
        two-prompt prefill (one behind a cached prefix, one top-p sampled), a decode step (one
        row sampled at temperature alone, one greedy), then top-k/top-p sampling of a batch
        large enough for the nucleus kernel, and penalties on a scratch row of counts (the
        runner's own are allocated by the first penalized request). Writes KV into the pool's
        first 9 blocks, so call it before serving; leaves no other trace (the runner's
        generator is restored). A pool or length too small: no-op."""
        bs = self.block_size
        if self.num_blocks < 9 or self.max_model_len < 4 * bs + 1:
            return
        greedy = SamplingParams(temperature=0.0, max_tokens=1)
        top_p = SamplingParams(temperature=1.0, top_p=0.9, seed=0, max_tokens=1)
        temperature = SamplingParams(temperature=1.0, seed=0, max_tokens=1)
        ids = [i % self.spec.vocab_size for i in range(4 * bs)]
        steps = [
            (SeqSlice("w0", tuple(ids[: 2 * bs + 3]), 0, (0, 1, 2), greedy),),
            (SeqSlice("w1", tuple(ids[bs:]), bs, (0, 3, 4, 5), top_p),
             SeqSlice("w2", tuple(ids[: bs + 1]), 0, (6, 7), greedy)),
            (SeqSlice("w1", (1,), 4 * bs, (0, 3, 4, 5, 8), temperature),
             SeqSlice("w2", (1,), bs + 1, (6, 7), greedy)),
        ]
        rows = TRITON_NUCLEUS_MIN_ROWS  # from this many top-k/top-p rows a kernel cuts the nucleus
        top_k = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=0, max_tokens=1)
        state = self.generator.get_state()
        for seqs in steps:
            self.execute(StepInput(seqs))
        with torch.inference_mode():
            logits = torch.zeros((rows, self.spec.vocab_size), dtype=self.dtype, device=self.device)
            sample_on_device(logits, [top_k] * rows, [0] * rows, None, self.generator).cpu()
            penalized = SamplingParams(repetition_penalty=1.1, frequency_penalty=0.1, max_tokens=1)
            sl = SeqSlice("wp", (1,), 0, (0,), penalized, history=History([1], [], 0))
            process(logits[:1], [sl], None, PenaltyCounts(self.spec.vocab_size, self.device, 1)).cpu()
        self.generator.set_state(state)
        self._prev_ids = []

    def execute(self, step: StepInput, layer_hook: LayerHook | None = None) -> StepOutput:
        """Run one step; `layer_hook(l)` is called once layer l's new KV is in the pool."""
        return self.launch(step, layer_hook).result()

    @torch.inference_mode()
    def launch(self, step: StepInput, layer_hook: LayerHook | None = None) -> LaunchedStep:
        """Queue one step's forward and sampling; the host is free until `result()`.

        Steps run in launch order; a slice with prev_row reads its token from the step launched
        just before (ValueError if that step did not sample this request at that row)."""
        if self._awaiting is not None and self._awaiting.needs_masks:
            raise RuntimeError("the last step still waits for its masks (PendingSampling.give_masks)")
        self.check(step)
        sampled = [s for s in step.seqs if s.sample]
        ids = [s.request_id for s in sampled]
        logits, prompt = self._forward(step, sampled, layer_hook)
        if logits is None:
            self._prev_ids = []
            return self._launched([], torch.empty(0, dtype=torch.int64), None, prompt)
        if any(s.mask_pending for s in sampled):
            self._prev_ids = ids[: self.prev_tokens.numel()]  # their tokens land in prev_tokens at sampling
            self._awaiting = PendingSampling(self, ids, sampled, logits, prompt)
            return self._awaiting
        return self._sample(ids, sampled, logits, prompt, [s.allowed for s in sampled])

    def _sample(self, ids: list[str], sampled: list[SeqSlice], logits: torch.Tensor,
                prompt: QueuedPromptLogprobs | None, allowed: list[bytes | None]) -> LaunchedStep:
        """Queue the sampling of a forward's logits (penalties, masks, logprobs); the tokens go
        to prev_tokens for the next step's placeholders."""
        params = [s.sampling for s in sampled]
        tokens = sample_on_device(
            process(logits, sampled, self.prev_tokens, self.penalty_counts), params, [s.end_pos for s in sampled],
            [s.suppress_token_ids for s in sampled], self.generator, allowed,
        )
        logprobs = queue_logprobs(logits, tokens, params)
        n = min(len(ids), self.prev_tokens.numel())
        self.prev_tokens[:n].copy_(tokens[:n])
        self._prev_ids = ids[:n]
        return self._launched(ids, tokens, logprobs, prompt)

    def _launched(self, ids: list[str], tokens: torch.Tensor, logprobs: QueuedLogprobs | None,
                  prompt: QueuedPromptLogprobs | None) -> LaunchedStep:
        """The step's results, on CUDA copied to pinned host memory by queued copies."""
        if self.device.type != "cuda":
            return LaunchedStep(ids, tokens, None, logprobs, prompt)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        logprobs = logprobs.to_host() if logprobs is not None else None
        prompt = prompt.to_host() if prompt is not None else None
        done = torch.cuda.Event()
        done.record()
        return LaunchedStep(ids, host, done, logprobs, prompt)

    def _forward(self, step: StepInput, sampled: list[SeqSlice], layer_hook: LayerHook | None
                 ) -> tuple[torch.Tensor | None, QueuedPromptLogprobs | None]:
        """Logits of the sampled slices (None when none samples) and the prompt logprobs."""
        if layer_hook is None and self.graphed(step):
            logits = self.graphs.run(step.seqs)
            if len(sampled) < len(step.seqs):
                logits = logits.index_select(0, to_device([i for i, s in enumerate(step.seqs) if s.sample],
                                                          logits.device))
            return logits, None
        ids, positions, meta = self._prepare(step.seqs)
        hidden = self.model.forward(ids, positions, meta, self.kv_pool, layer_hook)
        n = len(sampled)
        prompt = queue_prompt_logprobs(hidden[n:], step.seqs, self.model.compute_logits)
        return (self.model.compute_logits(hidden[:n]) if sampled else None), prompt

    def check(self, step: StepInput) -> None:
        """Refuse a step the pool, the model or the vocabulary cannot serve (ValueError)."""
        for s in step.seqs:
            self._validate(s)
        if len({s.request_id for s in step.seqs}) != len(step.seqs):
            raise ValueError("a request appears twice in one step")
        prev = self._prev_ids
        for s in step.seqs:
            if s.prev_row >= 0 and (s.prev_row >= len(prev) or prev[s.prev_row] != s.request_id):
                raise ValueError(f"{s.request_id}: placeholder token, but the last step did not sample "
                                 f"it at row {s.prev_row}")

    def graphed(self, step: StepInput) -> bool:
        """True when this step replays a CUDA graph (a pure-decode batch that fits one)."""
        return self.graphs is not None and self.graphs.fits(step.seqs)

    def _validate(self, s: SeqSlice) -> None:
        """Scalar checks of one slice; block ids are checked in bulk when the tables are built."""
        toks, start = s.token_ids, s.start_pos
        if not toks:
            raise ValueError(f"{s.request_id}: slice has no tokens")
        end = start + len(toks)
        if start < 0 or end > self.max_model_len:
            raise ValueError(
                f"{s.request_id}: positions {start}..{end - 1} outside [0, {self.max_model_len})"
            )
        window = self.spec.sliding_window
        if window is not None and end > window:
            # The reference attention has no window: refuse rather than compute it wrongly.
            raise ValueError(f"{s.request_id}: {end} tokens exceed the sliding window {window}")
        need = -(-end // self.block_size)
        if len(s.block_table) < need:
            raise ValueError(
                f"{s.request_id}: block table has {len(s.block_table)} blocks, positions up to "
                f"{end - 1} need {need}"
            )
        lo, hi = (toks[0], toks[0]) if len(toks) == 1 else (min(toks), max(toks))
        if s.prev_row >= 0:
            if toks != (PLACEHOLDER,):
                raise ValueError(f"{s.request_id}: prev_row set, so token_ids must be ({PLACEHOLDER},)")
            lo = hi = 0  # the placeholder: its token is checked where it was sampled
        if lo < 0 or hi >= self.spec.vocab_size:
            raise ValueError(f"{s.request_id}: token id outside the vocabulary")
        targets = s.prompt_targets
        if targets and (len(targets) > len(toks) or min(targets) < 0 or max(targets) >= self.spec.vocab_size):
            raise ValueError(f"{s.request_id}: {len(targets)} prompt targets for {len(toks)} tokens, "
                             f"or one outside the vocabulary")

    def _prepare(self, seqs: tuple[SeqSlice, ...]) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata]:
        """Flat host lists (slot mapping included) -> int32 device tensors in one copy."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        tables: list[int] = []
        rows: list[int] = []  # per placeholder token: (its flat index, the previous step's row)
        qsl = [0]
        width = max(-(-s.end_pos // bs) for s in seqs)
        for s in seqs:
            if s.prev_row >= 0:
                rows += (len(ids), s.prev_row)
            ids.extend(s.token_ids)
            pos.extend(range(s.start_pos, s.end_pos))
            slots.extend(flat_slot_mapping(s.block_table, s.start_pos, s.end_pos, bs))
            qsl.append(len(ids))
            tables.extend(s.block_table[:width])
            if len(s.block_table) < width:
                tables.extend([0] * (width - len(s.block_table)))
        lens = [s.end_pos for s in seqs]
        sample_idx = [qsl[i + 1] - 1 for i, s in enumerate(seqs) if s.sample]
        sample_idx += prompt_rows(seqs)  # their hidden rows follow the sampled ones'
        (ids_t, pos_t, slots_t, qsl_t, bt_t, lens_t, idx_t, rows_t), host = self._stager.upload(
            [ids, pos, slots, qsl, tables, lens, sample_idx, rows]
        )
        check_block_ids(host[4], seqs, self.num_blocks, bs)
        if rows:
            ids_t = fill_placeholders(ids_t, rows_t.view(-1, 2), self.prev_tokens)
        meta = AttnMetadata(
            slot_mapping=slots_t,
            block_tables=bt_t.view(len(seqs), width),
            seq_lens=lens_t,
            query_start_loc=qsl_t,
            is_decode=len(ids) == len(seqs),
            logits_indices=idx_t,
        )
        return ids_t, pos_t, meta
