"""`BatchCall`: a completions batch's generations (one per prompt, all running at once)
read in turn as one `UpstreamCall`: the prompts' messages first, then each generation's
chunks as choices `per_prompt * p ...`, its end a choice's end, one `final` for all."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from edge.upstream.calls import Sink, UpstreamCall
from edge.upstream.worker import Worker
from generated import sluice_pb2 as pb

_SUCCESS = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_TOOL_CALLS)


def is_prompt(chunk: pb.TokenChunk) -> bool:
    """Whether `chunk` is a prompt's message: its ids, logprobs or text, or (`stream_usage`)
    only its count, a usage with no output of its own."""
    if chunk.prompt_token_ids or chunk.prompt_logprobs or chunk.prompt_text:
        return True
    output = chunk.token_ids or chunk.text or chunk.reasoning or chunk.tool_calls
    return chunk.HasField("usage") and not output and not chunk.HasField("choice_end")


class BatchCall:
    """Generations `calls` (prompt order), each with `per_prompt` choices, as one call.
    `prompt_messages`: each generation opens with its prompt's message.

    Reading in turn needs no task or queue per message: a generation not read yet waits
    in its worker's log (and the HTTP/2 window). The final sums the usage and lists every
    choice's end. Messages are numbered anew: a batch is not resumable."""

    def __init__(
        self, calls: Sequence[UpstreamCall], per_prompt: int, prompt_messages: bool
    ) -> None:
        self._calls = calls
        self._per_prompt = per_prompt
        self._at = 0  # the generation being read
        # Each generation's first message, read ahead while the prompts' messages go first.
        self._ahead: list[pb.GenerateResponse | None] = [None] * len(calls)
        self._prompts_left = len(calls) if prompt_messages else 0
        self._index = 0
        self._final: pb.Final | None = None  # the batch's, once every generation ended
        self._ends: list[pb.ChoiceEnd] = []
        self._sum = pb.Usage()

    @property
    def worker(self) -> Worker:
        return self._calls[self._at].worker

    @property
    def request_id(self) -> str:
        return self._calls[self._at].request_id

    async def admitted(self) -> bool:
        """Every generation accepted; else False, and `read` raises the first refusal."""
        results = await asyncio.gather(*(c.admitted() for c in self._calls))
        if all(results):
            return True
        self._at = results.index(False)
        self._prompts_left = 0
        for i, call in enumerate(self._calls):
            if i != self._at:
                call.cancel()
        return False

    async def read(self, sink: Sink | None = None) -> pb.GenerateResponse:
        """The next message of the batch (`sink` is not used: every message comes out
        here, renumbered)."""
        if self._prompts_left:  # every prompt's message before any token
            p = len(self._calls) - self._prompts_left
            self._prompts_left -= 1
            msg = await self._calls[p].read()
            kind = msg.WhichOneof("kind")
            if kind == "chunk" and is_prompt(msg.chunk):
                return self._number(msg, p)
            self._ahead[p] = msg
        while self._final is None:
            p = self._at
            msg, self._ahead[p] = self._ahead[p] or await self._calls[p].read(), None
            if msg.WhichOneof("kind") == "chunk":
                return self._number(msg, p)
            if msg.final.reason not in _SUCCESS:
                return self._number(msg, p)  # a failed generation fails the batch
            end = self._ended(msg.final)
            if p + 1 < len(self._calls):
                self._at += 1
            else:
                self._final = self._whole(msg.final)
            if end is not None:
                return self._number(end, p)
        final, self._final = self._final, pb.Final()
        msg = pb.GenerateResponse(request_id=self.request_id)
        msg.final.CopyFrom(final)
        return self._number(msg, 0)

    def _ended(self, final: pb.Final) -> pb.GenerateResponse | None:
        """Note a generation's end; with one choice, its end as a chunk of its own."""
        self._usage(final.usage)
        if final.choices:  # several: each choice's last chunk carried its end
            self._ends.extend(final.choices)
            return None
        end = pb.ChoiceEnd(
            reason=final.reason,
            stop_sequence=final.stop_sequence,
            completion_tokens=final.usage.completion_tokens,
        )
        self._ends.append(end)
        msg = pb.GenerateResponse(request_id=self.request_id)
        msg.chunk.choice_end.CopyFrom(end)
        return msg

    def _usage(self, u: pb.Usage) -> None:
        self._sum.prompt_tokens += u.prompt_tokens
        self._sum.completion_tokens += u.completion_tokens
        self._sum.cached_prompt_tokens += u.cached_prompt_tokens

    def _whole(self, last: pb.Final) -> pb.Final:
        final = pb.Final()
        final.CopyFrom(last)
        final.ClearField("stop_sequence")
        final.usage.CopyFrom(self._sum)
        del final.choices[:]
        final.choices.extend(self._ends)
        return final

    def _number(self, msg: pb.GenerateResponse, p: int) -> pb.GenerateResponse:
        """The batch's numbering: its own index, prompt p's choices."""
        if msg.WhichOneof("kind") == "chunk":
            msg.chunk.choice += p * self._per_prompt
        msg.index = self._index
        self._index += 1
        return msg

    async def settle(self, timeout_s: float) -> bool:
        results = await asyncio.gather(*(c.settle(timeout_s) for c in self._calls))
        return all(results)

    def cancel(self) -> None:
        for call in self._calls:
            call.cancel()
