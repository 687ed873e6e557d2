"""Prompt and output-length distributions: the stream of requests a run sends.

Prompts are random common English words (about one token each for BPE tokenizers and
exactly one for the sim engine's word tokenizer), different for every request so a prefix
cache cannot make them free. Lengths are uniform in `mean * (1 +- spread)`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send."""

    prompt: str
    prompt_words: int
    max_tokens: int


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
