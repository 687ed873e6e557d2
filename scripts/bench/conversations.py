"""Multi-turn conversations: the workload that exercises prefix caches and routing on them.

`--workload multiturn`: `users` conversations are open at once; each is a system prompt
(one of `system_prompts` shared ones, `system_tokens` long: apps whose users share a
preamble) followed by its growing history, one user message (`prompt_tokens` words) per
turn and the answer the server actually streamed back. A request is the next turn of the
conversation that has waited longest; once its answer is in, the conversation goes to the
back of the line, and after `turns` turns it is replaced by a new one (a new user). So
with `concurrency` below `users`, every conversation waits for the others between its
turns, as real users think and type, and the servers must keep many histories cached at
once. Every turn's prompt extends the last one's: what a prefix cache can reuse.

Deterministic for a seed (the answers aside, which come from the server).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from scripts.bench.record import RequestRecord
from scripts.bench.workload import WORDS, RequestSpec, WorkloadConfig


@dataclass(slots=True)
class _Conversation:
    id: int
    messages: list[tuple[str, str]]
    rng: random.Random
    turn: int = 0
    pending: str = ""  # the user message of the turn in flight
    words: int = 0  # words in all messages so far


@dataclass(slots=True)
class _Totals:
    started: int = 0
    ended: int = 0
    failed_turns: int = 0
    turns: list[int] = field(default_factory=list)


class Conversations:
    """The multi-turn request stream (module docstring); `done()` feeds answers back."""

    def __init__(self, config: WorkloadConfig, seed_offset: int = 0) -> None:
        self.config = config
        self._rng = random.Random(config.seed * 1_000_003 + seed_offset + 7)
        self._offset = seed_offset
        self._systems = [self._system(i) for i in range(max(1, config.system_prompts))]
        self._idle: deque[_Conversation] = deque()
        self._busy: dict[int, _Conversation] = {}
        self._next_id = seed_offset * 10_000_000
        self.totals = _Totals()
        for _ in range(max(1, config.users)):
            self._idle.append(self._new())

    def _system(self, i: int) -> str:
        rng = random.Random(self.config.seed * 7919 + i)
        words = " ".join(rng.choices(WORDS, k=max(1, self.config.system_tokens)))
        return f"You are assistant number {i}. {words}"

    def _new(self) -> _Conversation:
        cid = self._next_id
        self._next_id += 1
        rng = random.Random(self._rng.getrandbits(64))
        system = self._systems[rng.randrange(len(self._systems))]
        self.totals.started += 1
        return _Conversation(cid, [("system", system)], rng, words=len(system.split()))

    def next(self) -> RequestSpec:
        conv = self._idle.popleft() if self._idle else self._new()
        cfg = self.config
        n = max(1, cfg.prompt_tokens)
        if cfg.prompt_spread > 0:
            lo, hi = round(n * (1 - cfg.prompt_spread)), round(n * (1 + cfg.prompt_spread))
            n = conv.rng.randint(max(1, lo), max(1, hi))
        conv.pending = " ".join(conv.rng.choices(WORDS, k=n))
        conv.turn += 1
        self._busy[conv.id] = conv
        messages = (*conv.messages, ("user", conv.pending))
        return RequestSpec(
            prompt="",
            prompt_words=conv.words + n,
            max_tokens=cfg.output_tokens,
            messages=messages,
            conversation=conv.id,
            turn=conv.turn,
        )

    def done(self, spec: RequestSpec, rec: RequestRecord) -> None:
        """A turn ended: its answer joins the history (a failed turn is asked again)."""
        conv = self._busy.pop(spec.conversation, None)
        if conv is None:
            return
        if rec.ok:
            conv.messages += [("user", conv.pending), ("assistant", rec.text)]
            conv.words += len(conv.pending.split()) + len(rec.text.split())
        else:
            conv.turn -= 1
            self.totals.failed_turns += 1
        if conv.turn >= self.config.turns:
            self.totals.ended += 1
            self.totals.turns.append(conv.turn)
            conv = self._new()
        self._idle.append(conv)
