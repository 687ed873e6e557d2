"""The sim's text: a small vocabulary, a word-level tokenizer, its chat template, a cheap
seeded sampler, the stop-string search, and a scripted answer's tokens."""

from __future__ import annotations

import functools
import hashlib
import re

from model_service.types import TokenLogprob, ToolCall, TopLogprob

MASK64 = (1 << 64) - 1

# A small vocabulary; token id = index. Text of a token is " " + word (one leading space).
VOCAB: tuple[str, ...] = tuple(
    "the a of to and in is it that was for on are as with his they at be this from "
    "have or by one had not but what all were when we there can an your which their said "
    "if do will each about how up out them then she many some so these would other into "
    "has more her two like him see time could no make than first been its who now people "
    "my made over did down only way find use may water long little very after words called "
    "just where most know river stream token model answer Paris light field number sound".split()
)
EOS_TOKEN_ID = len(VOCAB)
_WORD_RE = re.compile(r"\w+|[^\w\s]")


_SEEN: dict[int, str] = {}  # token id -> word, of the words tokenized so far (<= 65536)


def tokenize(text: str) -> list[int]:
    """A stable word-level tokenizer: each word or punctuation mark is one token."""
    ids = [word_id(w) for w in words(text)]
    _SEEN.update(zip(ids, words(text), strict=True))
    return ids


def decode(ids: list[int]) -> list[str]:
    """The words of token ids, as far as this process tokenized them (a hash has no
    inverse): an id never seen is ''."""
    return [_SEEN.get(i, "") for i in ids]


def words(text: str) -> list[str]:
    """The tokens' texts, one per token of `tokenize(text)`."""
    return _WORD_RE.findall(text)


def token_logprob(tid: int, text: str, pos: int, k: int) -> TokenLogprob:
    """The sim's logprob of a token it wrote at position `pos`: the most likely (rank 1),
    then k - 1 vocabulary words less likely."""
    lp = -((tid * 31 + pos) % 400) / 100 - 0.01
    top = [TopLogprob(tid, text, lp)] if k else []
    top += [TopLogprob(j, " " + VOCAB[j], lp - 1.0 - j) for j in range(k - 1)]
    return TokenLogprob(tid, lp, tuple(top), text, rank=1)


def prompt_logprobs(ids: list[int], texts: list[str] | None, k: int) -> list[TokenLogprob]:
    """The sim's prompt logprobs: each prompt token the most likely (rank 1, a logprob
    from its id and position), then k - 1 vocabulary words less likely; the first token
    has none. `texts`: the tokens' texts (None: a prompt given as ids, no text)."""
    out = [TokenLogprob(ids[0], 0.0, text=texts[0] if texts else "")] if ids else []
    for pos in range(1, len(ids)):
        out.append(token_logprob(ids[pos], texts[pos] if texts else "", pos, k))
    return out


@functools.lru_cache(maxsize=65536)
def word_id(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=2).digest())


def chat_template(messages: tuple[tuple[str, str], ...], add_generation_prompt: bool) -> str:
    """The sim's chat template: `<|role|> content` lines, then `<|assistant|>`."""
    lines = [f"<|{role}|> {content}" for role, content in messages]
    if add_generation_prompt:
        lines.append("<|assistant|>")
    return "\n".join(lines)


# A scripted answer's tokens (`--sim-answer`): <tags> (a thinking model's delimiters),
# words, runs of spaces, single marks.
_SCRIPT_RE = re.compile(r"</?[\w|:]+>|\w+|\s+|[^\w\s]")


def script_pieces(text: str) -> list[str]:
    return _SCRIPT_RE.findall(text)


class SimVocab(dict[str, int]):
    """The sim's vocabulary as a tokenizer's `get_vocab()`: every piece has an id (its
    `word_id`), so a reasoning parser finds its delimiters' ids in a scripted answer."""

    def get(self, key: str, default: int | None = None) -> int:  # type: ignore[override]
        return word_id(key)

    def __getitem__(self, key: str) -> int:
        return word_id(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)


class SimTokenizer:
    """What a vLLM reasoning parser asks of a tokenizer, for the sim's pieces."""

    def get_vocab(self) -> dict[str, int]:
        return SimVocab()


class Lcg:
    """A 64-bit linear congruential generator (Knuth's MMIX constants): the sim's "sampler".
    Seeding is free, unlike `random.Random`'s (5-11 µs a request)."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def below(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & MASK64
        return (self.state >> 33) % n


def with_calls(content: str, calls: tuple[ToolCall, ...]) -> str:
    """A message's content with the tool calls it made, as the sim's template writes them."""
    for call in calls:
        content += f" <tool_call> {call.name} {call.arguments}"
    return content


def find_stop(text: str, stops: tuple[str, ...], emitted: int) -> tuple[int, str] | None:
    """Earliest stop string in the not-yet-emitted tail of `text`: (position, string)."""
    best: tuple[int, str] | None = None
    for s in stops:
        pos = text.find(s, max(0, emitted - len(s) + 1))
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best
