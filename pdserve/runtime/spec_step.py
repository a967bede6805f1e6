"""One speculative step: every sequence's last token plus its drafts in one forward.

Slices with drafts (`SeqSlice.num_drafts`) go through the runner's varlen (prefill-style)
attention, which already attends several query tokens per sequence over the paged cache
(pdserve.kernels.reference on CPU, the Triton prefill kernel on CUDA); logits are computed only for
each sampled slice's last 1 + num_drafts positions and verified per sequence
(runtime/spec_verify.py). Slices without drafts are sampled in the same forward. KV written
for rejected drafts lies past the sequence's new length and is overwritten when those
positions are computed again. A step without any draft takes the runner's ordinary path, so
CUDA graphs still serve it; verify steps replay graphs of their own where they fit
(runtime/spec_graphs.py) and run eagerly otherwise.
"""

from __future__ import annotations

import dataclasses

import torch

from pdserve.core.step_io import SeqSlice, StepInput, StepOutput
from pdserve.runtime.loop import LayerHook
from pdserve.runtime.prompt_logprobs import prompt_rows, queue_prompt_logprobs
from pdserve.runtime.runner import ModelRunner
from pdserve.runtime.sampler import to_device
from pdserve.runtime.spec_graphs import VerifyGraphs
from pdserve.runtime.spec_verify import verify_step


class SpeculativeRunner:
    """The engine loop's runner on a worker with --speculative-config: verifies drafts.

    With `num_speculative_tokens` on a CUDA runner that uses graphs, verify steps of up to 32
    sequences replay captured graphs (runtime/spec_graphs.py); others run eagerly."""

    def __init__(self, runner: ModelRunner, num_speculative_tokens: int | None = None) -> None:
        self.runner = runner
        self.graphs: VerifyGraphs | None = None
        if num_speculative_tokens and runner.graphs is not None:
            self.graphs = VerifyGraphs(
                runner.model, runner.kv_pool, block_size=runner.block_size,
                max_model_len=runner.max_model_len, num_speculative_tokens=num_speculative_tokens,
                max_num_seqs=runner.graphs.max_batch)

    def execute(self, step: StepInput, layer_hook: LayerHook | None = None) -> StepOutput:
        for s in step.seqs:
            if s.num_drafts:
                if layer_hook is not None:
                    raise ValueError("a speculative step cannot push KV layer by layer")
                if self.graphs is not None and self.graphs.fits(step.seqs):
                    return execute_graphed(self.runner, self.graphs, step)
                return execute_speculative(self.runner, step)
        return self.runner.execute(step, layer_hook)


@torch.inference_mode()
def execute_graphed(runner: ModelRunner, graphs: VerifyGraphs, step: StepInput) -> StepOutput:
    """A verify step through a captured graph (every slice sampled, at most K drafts)."""
    runner.check(step)
    for s in step.seqs:
        if s.num_drafts >= len(s.token_ids):
            raise ValueError(f"{s.request_id}: num_drafts {s.num_drafts} needs more tokens than drafts")
    logits, firsts = graphs.run(step.seqs)
    return verify_step(logits, list(zip(step.seqs, firsts)), runner.generator, runner.penalty_counts)


@torch.inference_mode()
def execute_speculative(runner: ModelRunner, step: StepInput) -> StepOutput:
    """Run one step that may carry drafts; verified tokens come back in StepOutput.emitted."""
    if not step.seqs:
        return StepOutput()
    if not any(s.num_drafts for s in step.seqs):
        return runner.execute(step)
    runner.check(step)
    rows: list[int] = []
    owned: list[tuple[SeqSlice, int]] = []
    end = 0
    for s in step.seqs:
        end += len(s.token_ids)
        if s.num_drafts and (not s.sample or s.num_drafts >= len(s.token_ids)):
            raise ValueError(f"{s.request_id}: num_drafts {s.num_drafts} needs a sampled slice "
                             f"with more tokens than drafts")
        if s.sample:
            owned.append((s, len(rows)))
            rows.extend(range(end - s.num_drafts - 1, end))
    ids, positions, meta = runner._prepare(step.seqs)
    idx = to_device(rows + prompt_rows(step.seqs), runner.device)  # prompt logprobs' rows last
    meta = dataclasses.replace(meta, logits_indices=idx, is_decode=False)
    hidden = runner.model.forward(ids, positions, meta, runner.kv_pool)
    logits = runner.model.compute_logits(hidden[: len(rows)])
    out = verify_step(logits, owned, runner.generator, runner.penalty_counts)
    prompt = queue_prompt_logprobs(hidden[len(rows):], step.seqs, runner.model.compute_logits)
    return out if prompt is None else dataclasses.replace(out, prompt_logprobs=prompt.by_request())
