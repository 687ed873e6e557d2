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

from scripts import options as shared
from sluice_common.options import option

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
    """Request shape: prompt and output lengths (tokens), sampling (the `workload` options)."""

    # Lengths uniform in mean * (1 - spread) .. mean * (1 + spread).
    prompt_tokens: int = option(64, "--prompt-tokens", "mean prompt length, tokens")
    prompt_spread: float = option(0.0, "--prompt-spread", "fraction, uniform +-")
    output_tokens: int = option(128, "--output-tokens", "max_tokens")
    output_spread: float = option(0.0, "--output-spread", "fraction, uniform +-")
    # On: always generate max_tokens, whatever the model says.
    ignore_eos: bool = option(
        True, "--no-ignore-eos", "let the model stop early", action="store_false"
    )
    temperature: float = option(0.0, "--temperature", "sampling temperature")
    api: str = option(
        "chat", "--api", "messages (chat) or a raw prompt", choices=("chat", "completions")
    )
    seed: int = shared.seed(0)
    kind: str = option(
        "single",
        "--workload",
        "independent prompts, or conversations (conversations.py)",
        choices=("single", "multiturn"),
    )
    users: int = option(128, "--users", "multiturn: conversations open")
    turns: int = option(8, "--turns", "multiturn: turns per conversation")
    system_prompts: int = option(4, "--system-prompts", "multiturn: shared ones")
    system_tokens: int = option(256, "--system-tokens", "multiturn: words in each")
    session_user: bool = option(
        False,
        "--session-user",
        "multiturn: the conversation as the OpenAI `user`",
        action="store_true",
    )


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
