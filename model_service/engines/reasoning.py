"""`--reasoning-parser NAME`: one of vLLM's reasoning parsers (`vllm.reasoning`) as a
`Reasoner`, splitting a choice's streamed output into thinking and answer. Any engine
that can give the parser a tokenizer uses it (vLLM its own; the sim its word vocabulary),
so vLLM is imported only when a parser is named."""

from __future__ import annotations

from typing import Any


def parser_class(name: str) -> Any:
    """vLLM's reasoning parser class for `name`; RuntimeError listing the known ones
    otherwise (a wrong name fails the worker's start, not a request)."""
    from vllm.reasoning import ReasoningParserManager

    try:
        return ReasoningParserManager.get_reasoning_parser(name)
    except KeyError:
        known = ", ".join(sorted(ReasoningParserManager.list_registered()))
        raise RuntimeError(
            f"--reasoning-parser {name!r} is not a vLLM reasoning parser ({known})"
        ) from None


class VllmReasoner:
    """One choice's output through a vLLM reasoning parser (its streaming interface: the
    text and ids so far, and the delta)."""

    __slots__ = ("_ids", "_parser", "_text")

    def __init__(self, cls: Any, tokenizer: Any) -> None:
        self._parser = cls(tokenizer)
        self._text = ""
        self._ids: list[int] = []

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, str]:
        previous, previous_ids = self._text, self._ids
        self._text = previous + text
        self._ids = previous_ids + token_ids
        delta = self._parser.extract_reasoning_streaming(
            previous, self._text, text, previous_ids, self._ids, token_ids
        )
        if delta is None:  # a delimiter alone: neither thinking nor answer
            return "", ""
        return delta.reasoning or "", delta.content or ""
