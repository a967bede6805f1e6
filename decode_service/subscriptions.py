"""Subscribe streams: a gateway's requests multiplexed on one stream, one message per step."""

from __future__ import annotations

from opentelemetry import trace

from pdserve.core.request import Finish
from pdserve.core.scheduler import TokenEvent
from pdserve.proto import worker_pb2
from pdserve.serving import logprobs_to_wire
from pdserve.streams import StepStream

FINISH_TO_WIRE = {
    Finish.STOP: worker_pb2.WORKER_FINISH_STOP,
    Finish.LENGTH: worker_pb2.WORKER_FINISH_LENGTH,
    Finish.ABORT: worker_pb2.WORKER_FINISH_ABORT,
}


def add_event(batch: worker_pb2.TokenBatch, ev: TokenEvent) -> bool:
    """Append an engine event to its request's batch; True when it ends the request."""
    if ev.token >= 0:
        batch.token_ids.append(ev.token)
        if ev.logprobs is not None:
            logprobs_to_wire(ev.logprobs, batch.logprobs.add())
        for lp in ev.prompt_logprobs or ():
            logprobs_to_wire(lp, batch.prompt_logprobs.add())
    if ev.finish is None:
        return False
    batch.finish = FINISH_TO_WIRE[ev.finish]
    return True


class Subscription:
    """The requests started on one Subscribe stream, their events and their open spans."""

    def __init__(self) -> None:
        self.stream = StepStream()
        self.live: dict[str, tuple[trace.Span, int]] = {}  # request id -> (decode.generate span, tokens)

    def add(self, request_id: str, span: trace.Span = trace.INVALID_SPAN) -> None:
        self.live[request_id] = (span, 0)

    def discard(self, request_id: str) -> None:
        self.live.pop(request_id, None)

    def message(self, events: list[TokenEvent]) -> worker_pb2.StepTokens:
        """One StepTokens for a step's events (a request's tokens in one batch); a finished
        request leaves the subscription and its span ends."""
        msg = worker_pb2.StepTokens()
        batches: dict[str, worker_pb2.TokenBatch] = {}
        for ev in events:
            rid = ev.request_id
            batch = batches.get(rid)
            if batch is None:
                batch = batches[rid] = msg.batches.add()
                batch.request_id = rid
            add_event(batch, ev)
        for rid, batch in batches.items():
            entry = self.live.get(rid)
            if entry is None:
                continue
            n = entry[1] + len(batch.token_ids)
            if batch.finish == worker_pb2.WORKER_FINISH_NONE:
                self.live[rid] = (entry[0], n)
            else:
                del self.live[rid]
                _end(entry[0], n)
        return msg

    def close(self) -> list[str]:
        """The stream ended: end every open span; returns the requests still running."""
        left = list(self.live)
        for span, n in self.live.values():
            _end(span, n)
        self.live.clear()
        return left


def _end(span: trace.Span, tokens: int) -> None:
    span.set_attribute("gen_ai.usage.output_tokens", tokens)
    span.end()
