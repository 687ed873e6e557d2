"""Prompt and output-length distributions: the stream of requests a run sends.

Prompts are random common English words (about one token each for BPE tokenizers and
exactly one for the sim engine's word tokenizer), different for every request so a prefix
cache cannot make them free. Lengths are uniform in `mean * (1 +- spread)`.

`kind = "multiturn"` is the other workload: conversations whose prompts grow turn by turn
(`conversations.py`); `make_workload` picks the one a config asks for.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scripts.bench.record import RequestRecord

WORDS: tuple[str, ...] = tuple(
    "the of and to in is it you that he was for on are with as his they be at one have "
    "this from or had by word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come "
    "did number sound no most people my over know water than call first who may down side "
    "been now find any new work part take get place made live where after back little only "
    "round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right "
    "boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world".split()
)


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Request shape: prompt and output lengths (tokens), sampling."""

    prompt_tokens: int = 64
    prompt_spread: float = 0.0  # fraction: lengths uniform in mean*(1-s) .. mean*(1+s)
    output_tokens: int = 128
    output_spread: float = 0.0
    ignore_eos: bool = True  # always generate max_tokens, whatever the model says
    temperature: float = 0.0
    api: str = "chat"  # "chat" (messages) or "completions" (raw prompt)
    seed: int = 0
    kind: str = "single"  # "single" (independent prompts) or "multiturn" (conversations)
    users: int = 128  # multiturn: conversations open at once
    turns: int = 8  # multiturn: turns per conversation
    system_prompts: int = 4  # multiturn: distinct shared system prompts
    system_tokens: int = 256  # multiturn: words in each system prompt
    session_user: bool = False  # multiturn: send the conversation as the OpenAI `user`


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send."""

    prompt: str
    prompt_words: int
    max_tokens: int
    messages: tuple[tuple[str, str], ...] = ()  # chat history (multiturn); else `prompt`
    conversation: int = -1
    turn: int = 0


def _length(rng: random.Random, mean: int, spread: float) -> int:
    if spread <= 0:
        return max(1, mean)
    lo = max(1, round(mean * (1 - spread)))
    hi = max(lo, round(mean * (1 + spread)))
    return rng.randint(lo, hi)


class Workload:
    """An endless, seeded sequence of request specs."""

    def __init__(self, config: WorkloadConfig, seed_offset: int = 0) -> None:
        self.config = config
        self._rng = random.Random(config.seed * 1_000_003 + seed_offset)

    def next(self) -> RequestSpec:
        cfg, rng = self.config, self._rng
        n = _length(rng, cfg.prompt_tokens, cfg.prompt_spread)
        prompt = " ".join(rng.choices(WORDS, k=n))
        return RequestSpec(prompt, n, _length(rng, cfg.output_tokens, cfg.output_spread))

    def done(self, spec: RequestSpec, rec: RequestRecord) -> None:
        """Independent requests: nothing to learn from an answer."""


class Source(Protocol):
    """Where a run's requests come from."""

    def next(self) -> RequestSpec: ...

    def done(self, spec: RequestSpec, rec: RequestRecord) -> None: ...


def make_workload(config: WorkloadConfig, seed_offset: int = 0) -> Source:
    """The request source a config asks for."""
    if config.kind == "multiturn":
        from scripts.bench.conversations import Conversations

        return Conversations(config, seed_offset)
    return Workload(config, seed_offset)
