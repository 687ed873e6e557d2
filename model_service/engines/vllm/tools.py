"""Tool choice `auto` on vLLM: a vLLM tool parser (`--tool-call-parser hermes`, ...) as a
`CallParser`. Call ids are ours, so a replay is byte-identical and ids are stable per
generation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model_service.engines.base import Delta
from model_service.types import GenerationRequest, ToolCallDelta


def parser_class(name: str) -> Any:
    """vLLM's parser class for `name`; RuntimeError listing the known ones otherwise."""
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except KeyError:
        known = ", ".join(ToolParserManager.list_registered())
        raise RuntimeError(
            f"--tool-call-parser {name!r} is not a vLLM tool parser ({known})"
        ) from None


class VllmCallParser:
    """One choice's tool calls, found by a vLLM tool parser while the output streams."""

    def __init__(
        self, name: str, tokenizer: Any, request: GenerationRequest, ids: Callable[[int], str]
    ) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                },
            }
            for t in request.tools
        ]
        self._request = ChatCompletionRequest.model_validate(
            {
                "model": "sluice",
                "messages": [{"role": "user", "content": ""}],
                "tools": tools,
                "tool_choice": "auto",
            }
        )
        self._parser = parser_class(name)(tokenizer, self._request.tools)
        self._ids = ids
        self._text = ""
        self._token_ids: list[int] = []
        self._last_index = -1
        self.called = False

    def feed(self, text: str, token_ids: list[int]) -> Delta:
        previous, previous_ids = self._text, self._token_ids
        self._text = previous + text
        self._token_ids = previous_ids + token_ids
        delta = self._parser.extract_tool_calls_streaming(
            previous, self._text, text, previous_ids, self._token_ids, token_ids, self._request
        )
        if delta is None:
            return "", []
        calls = []
        for tc in delta.tool_calls or ():
            fn = tc.function
            name = (fn.name if fn is not None else None) or ""
            args = (fn.arguments if fn is not None else None) or ""
            call_id = self._ids(tc.index) if tc.id else ""
            calls.append(ToolCallDelta(tc.index, call_id, name, args))
            self._last_index = max(self._last_index, tc.index)
            self.called = True
        return delta.content or "", calls

    def end(self) -> Delta:
        rest = self._parser.get_remaining_unstreamed_args() if self.called else ""
        if rest:
            return "", [ToolCallDelta(self._last_index, arguments=rest)]
        return "", []
