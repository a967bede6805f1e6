"""Iteration-level scheduler shared by the prefill, decode and colocated workers (pure Python).

Each step: every running sequence decodes one token (plus n-gram drafts to verify with
--speculative-config, core/spec_schedule.py; growing its blocks, preempting the newest
sequence by recompute when blocks run out), then waiting sequences are prefilled first come,
first served, in chunks that fit the token budget. Prefix-cached blocks are reused. A request's
priority (params.priority, lower first) comes before its arrival in both orders: the waiting
queue's and the running sequences' (whose last is the one preempted).

Overlap: while one step runs, `schedule_next` may plan the next one, every running sequence
one token further with that token a placeholder the runner fills on the device. Up to two
steps are then in flight; `update` applies them in order. A sequence that ends in the first
keeps its blocks until the second is applied (that step still writes them), and the second
step's token for it is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.core.block_manager import BlockManager, cacheable_blocks
from pdserve.core.request import Finish, Sequence, SeqStatus, TokenGuide, check_finish
from pdserve.core.spec_schedule import DraftPlanner
from pdserve.core.step_io import PLACEHOLDER, History, SeqSlice, StepInput, StepOutput, TokenLogprobs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    enable_prefix_caching: bool = True


@dataclass(slots=True, unsafe_hash=True)
class TokenEvent:
    """A token sampled for a request (token -1 when it ended without one) and why it ended.
    A request's first token carries the prompt's logprobs when it asked for them.

    Treat it as immutable; not frozen, which would cost an object.__setattr__ per field."""

    request_id: str
    token: int
    finish: Finish | None
    logprobs: TokenLogprobs | None = None  # when the request asked for them
    prompt_logprobs: tuple[TokenLogprobs, ...] | None = None  # prompt tokens 1.., first token only


def with_history(sl: SeqSlice, seq: Sequence) -> SeqSlice:
    """sl carrying a view of seq's tokens before it (for the penalties; no copy)."""
    return dataclasses.replace(sl, history=History(seq.prompt_ids, seq.output_ids, sl.start_pos))


class Scheduler:
    """Owns the sequences of one worker and decides what each step computes."""

    def __init__(self, cfg: SchedulerConfig, blocks: BlockManager, spec: DraftPlanner | None = None,
                 guide_masks: Callable[[list[TokenGuide]], list[bytes]] | None = None) -> None:
        self.cfg = cfg
        self.blocks = blocks
        self.spec = spec  # speculative decoding: drafts after each running sequence's last token
        # structured output: the masks of a step's guides at once (GuideCompiler.masks: in parallel)
        self.guide_masks = guide_masks or (lambda guides: [g.allowed() for g in guides])
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._hashes: dict[str, list[int]] = {}
        self._registered: dict[str, int] = {}
        # ids whose full prompt blocks may not all be registered yet (a superset)
        self._unregistered: set[str] = set()
        # request id -> (the block_table list, its tuple): reused while the list is the same
        # object of the same length (the scheduler only extends tables or replaces them)
        self._tables: dict[str, tuple[list[int], tuple[int, ...]]] = {}
        self._running_sorted = True  # self.running is in arrival order
        self._inflight: list[set[str]] = []  # request ids of each step in flight, oldest first
        self._last = StepInput(())  # the step scheduled last
        self._free_later: list[int] = []  # blocks a step in flight still writes: freed by the next update
        self._aborted: set[str] = set()
        self._guided = 0  # sequences with a guide (structured output) not yet finished
        self._arrivals = 0
        self.preemptions = 0
        self.prefix_hit_tokens = 0

    # -- admission -------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a sequence. A RUNNING one must already hold blocks for all tokens but its last."""
        if seq.request_id in self._by_id or self.in_step(seq.request_id):  # ended, its step still running
            raise ValueError(f"duplicate request id {seq.request_id}")
        self._arrivals += 1
        seq.arrival = self._arrivals
        seq.order = (seq.params.priority, seq.arrival)
        if seq.guide is not None:
            self._guided += 1
        self._by_id[seq.request_id] = seq
        if self.cfg.enable_prefix_caching:
            self._hashes[seq.request_id] = hashes = self.blocks.hashes(seq.prompt_ids)
            if hashes:
                self._unregistered.add(seq.request_id)
        if seq.status is SeqStatus.RUNNING:
            self._append_running(seq)
        else:
            self._enqueue(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request; its blocks are freed now, or at the end of the step that uses them."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return False
        if self.in_step(request_id):
            self._aborted.add(request_id)
        else:
            self._finish(seq, Finish.ABORT)
        return True

    def in_step(self, request_id: str) -> bool:
        """True while the request is part of a step being executed."""
        return any(request_id in ids for ids in self._inflight)

    def fail_step(self, step: StepInput) -> None:
        """The runner failed this step: its sequences end as aborted at update()."""
        self._aborted.update(sl.request_id for sl in step.seqs)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def queued_tokens(self) -> int:
        return sum(len(s) - s.num_computed for s in self.waiting)

    # -- one step --------------------------------------------------------------------------

    def schedule(self) -> StepInput:
        """Pick this step's work; blocks for it are allocated before it is returned."""
        slices: list[SeqSlice] = []
        budget = self.cfg.max_num_batched_tokens
        block_size = self.blocks.block_size
        # Oldest first, so the preemption victim (the newest) is never one already scheduled.
        if not self._running_sorted:
            self.running.sort(key=lambda s: s.order)
            self._running_sorted = True
        running_status = SeqStatus.RUNNING
        append = slices.append
        spec = self.spec
        if spec is not None:
            spec.begin_step(self.running)
        for seq in list(self.running):
            if seq.status is not running_status or budget <= 0:
                continue
            out = seq.output_ids
            n = len(seq.prompt_ids) + len(out)
            bt = seq.block_table
            if n > len(bt) * block_size:
                if not self._grow(seq, n):
                    continue
                bt = seq.block_table
            drafts = spec.drafts(seq, budget, self.blocks, len(self.running)) if spec is not None else ()
            # the decode slice of _slice(seq, n - 1, n), built inline (one per sequence per step)
            rid, params = seq.request_id, seq.params
            sl = SeqSlice(
                rid,
                ((out[-1],) if out else seq.token_slice(n - 1, n)) + drafts,
                n - 1,
                self._table(seq),
                params,
                True,
                seq.suppressed() if params.min_tokens else (),
                len(drafts),
            )
            append(with_history(sl, seq) if params.penalized else sl)
            budget -= 1 + len(drafts)
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_computed == 0 and not seq.block_table:
                self._reuse_prefix(seq)
            end = min(len(seq), seq.num_computed + budget)
            if not self._take_blocks(seq, end):
                break
            slices.append(self._slice(seq, seq.num_computed, end))
            budget -= end - seq.num_computed
            if end < len(seq):
                break  # the rest of this prompt is the next step's chunk
            self.waiting.popleft()
            self._append_running(seq)
            seq.status = SeqStatus.RUNNING
        if self._guided:
            self._fill_masks(slices)
        return self._planned(slices)

    def pending_masks(self, step: StepInput) -> dict[str, bytes]:
        """The masks of a step's mask_pending slices, from their guides as they stand (call it
        once the step before is applied); a sequence that ended meanwhile gets none (its token
        will be dropped)."""
        todo = [(sl.request_id, seq.guide) for sl in step.seqs
                if sl.mask_pending and (seq := self._by_id.get(sl.request_id)) is not None
                and seq.guide is not None and seq.request_id not in self._aborted]
        return dict(zip([r for r, _ in todo], self.guide_masks([g for _, g in todo]))) if todo else {}

    def _fill_masks(self, slices: list[SeqSlice]) -> None:
        """SeqSlice.allowed of every sampled slice of a guided sequence, in one guide_masks call."""
        todo = [(sl, g) for sl in slices if sl.sample and (g := self._by_id[sl.request_id].guide) is not None]
        if todo:
            for (sl, _), mask in zip(todo, self.guide_masks([g for _, g in todo])):
                sl.allowed = mask

    def schedule_next(self) -> StepInput | None:
        """While the last step scheduled runs (not yet updated): the next step, each running
        sequence decoding one more token. A sequence that step samples for decodes its unknown
        token as a placeholder (SeqSlice.prev_row); one certain to end there by length is left
        out. None, with nothing changed but tables grown, when the next step needs more:
        waiting requests, drafts, a preemption, or no single step in flight. A guided sequence's
        slice is mask_pending: its mask needs the token on the way (pending_masks, once the step
        in flight is applied)."""
        running = self.running
        if (len(self._inflight) != 1 or self.waiting or self.spec is not None
                or len(running) > self.cfg.max_num_batched_tokens):
            return None
        rows, r = {}, 0
        for sl in self._last.seqs:
            if sl.sample:
                if not sl.num_drafts:
                    rows[sl.request_id] = r
                r += 1
        slices: list[SeqSlice] = []
        block_size, max_len = self.blocks.block_size, self.cfg.max_model_len
        for seq in running:
            rid, out, params = seq.request_id, seq.output_ids, seq.params
            if rid in self._aborted:
                continue
            row = rows.get(rid, -1)
            if row < 0:  # no token on the way: the plain decode slice
                n, pending, tokens = len(seq), 0, ((out[-1],) if out else seq.token_slice(len(seq) - 1, len(seq)))
            else:
                n, pending, tokens = len(seq) + 1, 1, (PLACEHOLDER,)
                if len(out) + 1 >= params.max_tokens or n >= max_len:
                    continue  # the token on the way ends it
            if n > len(seq.block_table) * block_size and not self._take_blocks(seq, n):
                return None
            sl = SeqSlice(rid, tokens, n - 1, self._table(seq), params, True,
                          seq.suppressed(pending) if params.min_tokens else (), 0, row)
            sl.mask_pending = seq.guide is not None
            slices.append(with_history(sl, seq) if params.penalized else sl)
        return self._planned(slices) if slices else None

    def _table(self, seq: Sequence) -> tuple[int, ...]:
        """seq's block table as a tuple, rebuilt only when the list changed."""
        bt, cached = seq.block_table, self._tables.get(seq.request_id)
        if cached is None or cached[0] is not bt or len(cached[1]) != len(bt):
            cached = self._tables[seq.request_id] = (bt, tuple(bt))
        return cached[1]

    def _planned(self, slices: list[SeqSlice]) -> StepInput:
        """The step to run; in flight until its update (an empty one is never run)."""
        self._last = StepInput(tuple(slices))
        if slices:
            self._inflight.append({s.request_id for s in slices})
        return self._last

    def update(self, step: StepInput, out: StepOutput) -> list[TokenEvent]:
        """Apply a step's results; returns the tokens sampled and the sequences that ended."""
        events: list[TokenEvent] = []
        current = self._inflight.pop(0) if step.seqs and self._inflight else set()
        free_now, self._free_later = self._free_later, []
        by_id, aborted, unregistered = self._by_id, self._aborted, self._unregistered
        sampled, max_len = out.sampled, self.cfg.max_model_len
        for sl in step.seqs:
            rid = sl.request_id
            seq = by_id.get(rid)
            if seq is None:
                continue
            if aborted and rid in aborted:  # a failed step's KV must never enter the prefix cache
                events.append(TokenEvent(rid, -1, Finish.ABORT))
                self._finish(seq, Finish.ABORT)
                continue
            seq.num_computed = sl.start_pos + len(sl.token_ids) - sl.num_drafts  # accepted ones: below
            if rid in unregistered:
                self._register_prefix(seq)
            if sl.prompt_targets:
                seq.prompt_logprobs += out.prompt_logprobs[rid]
            if not sl.sample:
                continue
            if sl.num_drafts:
                self._apply_verified(seq, sl, out.emitted[rid], events)
                continue
            token = sampled[rid]
            seq.output_ids.append(token)
            finish = check_finish(seq, max_len)
            if seq.guide is not None and not seq.guide.accept(token) and finish is None:
                log.error("%s: token %d leaves its structured output's language; aborted", rid, token)
                finish = Finish.ABORT
            event = TokenEvent(rid, token, finish, out.logprobs.get(rid) if out.logprobs else None)
            if seq.params.prompt_logprobs is not None and len(seq.output_ids) == 1:
                event.prompt_logprobs, seq.prompt_logprobs = tuple(seq.prompt_logprobs), []
            events.append(event)
            if finish is not None:
                self._finish(seq, finish)
        aborted -= current
        if not self._inflight:  # nothing runs any more: nothing writes the deferred blocks
            free_now += self._free_later
            self._free_later = []
        self.blocks.free(free_now)
        return events

    # -- helpers ---------------------------------------------------------------------------

    def _apply_verified(self, seq: Sequence, sl: SeqSlice, tokens: tuple[int, ...],
                        events: list[TokenEvent]) -> None:
        """Emit a verify step's tokens up to the first finish; free blocks only rejected drafts used."""
        accepted = len(tokens) - 1
        self.spec.verified(seq.request_id, sl.num_drafts, accepted)  # type: ignore[union-attr]
        seq.num_computed += accepted
        for token in tokens:
            seq.output_ids.append(token)
            finish = check_finish(seq, self.cfg.max_model_len)
            events.append(TokenEvent(seq.request_id, token, finish))
            if finish is not None:
                self._finish(seq, finish)
                return
        keep = self.blocks.blocks_for(len(seq))
        if len(seq.block_table) > keep:
            self.blocks.free(seq.block_table[keep:])
            del seq.block_table[keep:]
            self._tables.pop(seq.request_id, None)  # the cached tuple assumes tables only grow

    def _append_running(self, seq: Sequence) -> None:
        if self.running and self.running[-1].order > seq.order:
            self._running_sorted = False
        self.running.append(seq)

    def _slice(self, seq: Sequence, start: int, end: int) -> SeqSlice:
        sl = SeqSlice(
            request_id=seq.request_id,
            token_ids=seq.token_slice(start, end),
            start_pos=start,
            block_table=tuple(seq.block_table),
            sampling=seq.params,
            sample=end == len(seq),
            suppress_token_ids=seq.suppressed(),
            prompt_targets=seq.prompt_targets(start, end),
        )
        return with_history(sl, seq) if seq.params.penalized else sl

    def _take_blocks(self, seq: Sequence, num_tokens: int) -> bool:
        need = self.blocks.blocks_for(num_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        if need > self.blocks.num_free:
            return False
        seq.block_table += self.blocks.allocate(need)
        return True

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Blocks for a running sequence, preempting the last others in order (lowest priority,
        newest); False if seq itself went."""
        while not self._take_blocks(seq, num_tokens):
            victim = max(
                (s for s in self.running if s.status is SeqStatus.RUNNING), key=lambda s: s.order
            )
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.status = SeqStatus.WAITING
        self.running.remove(seq)
        self._enqueue(seq)
        self.preemptions += 1

    def _enqueue(self, seq: Sequence) -> None:
        """Into the waiting queue in order (a new request of equal priority goes last, in O(1)).
        Only the head may hold blocks (a partial chunk, prefix hits): a head put behind another
        gives its blocks back, or the new head could wait forever for them."""
        waiting, at = self.waiting, len(self.waiting)
        while at and waiting[at - 1].order > seq.order:
            at -= 1
        if at == 0 and waiting and waiting[0].block_table:
            self._release(waiting[0])
        waiting.insert(at, seq)

    def _release(self, seq: Sequence) -> None:
        """Free seq's blocks and forget its progress: it recomputes from scratch."""
        self.blocks.free(seq.block_table)
        seq.block_table, seq.num_computed, seq.num_cached = [], 0, 0
        seq.prompt_logprobs = []  # recomputed from the start
        self._registered.pop(seq.request_id, None)
        if self._hashes.get(seq.request_id):
            self._unregistered.add(seq.request_id)

    def _reuse_prefix(self, seq: Sequence) -> None:
        hashes = self._hashes.get(seq.request_id)
        if not hashes or seq.owes_prompt_logprobs:  # prompt logprobs need every position's logits
            return
        # Always recompute at least the last token, so the last cached block is left alone.
        usable = hashes[: cacheable_blocks(len(seq), self.blocks.block_size)]
        hit = self.blocks.lookup(usable)
        seq.block_table = hit
        seq.num_computed = seq.num_cached = len(hit) * self.blocks.block_size
        self.prefix_hit_tokens += seq.num_computed

    def _register_prefix(self, seq: Sequence) -> None:
        hashes = self._hashes.get(seq.request_id)
        if not hashes:
            return
        done = self._registered.get(seq.request_id, 0)
        if done >= len(hashes):
            self._unregistered.discard(seq.request_id)
            return  # every full prompt block is registered already (the decode steady state)
        full = min(len(hashes), seq.num_computed // self.blocks.block_size)
        for i in range(done, full):
            self.blocks.register(seq.block_table[i], hashes[i])
        self._registered[seq.request_id] = max(done, full)
        if max(done, full) >= len(hashes):
            self._unregistered.discard(seq.request_id)

    def _finish(self, seq: Sequence, why: Finish) -> None:
        seq.status, seq.finish = SeqStatus.FINISHED, why
        if self.in_step(seq.request_id):  # a later step in flight still writes these blocks
            self._free_later += seq.block_table
        else:
            self.blocks.free(seq.block_table)
        seq.block_table = []
        if self._by_id.pop(seq.request_id, None) is not None and seq.guide is not None:
            self._guided -= 1
        self._hashes.pop(seq.request_id, None)
        self._registered.pop(seq.request_id, None)
        self._unregistered.discard(seq.request_id)
        self._tables.pop(seq.request_id, None)
        if self.spec is not None:
            self.spec.forget(seq.request_id)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
