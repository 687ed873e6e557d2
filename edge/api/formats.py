"""OpenAI response objects: streamed chunks (bytes, built from per-stream templates) and
whole non-streaming responses.

Per token the hot path is one `orjson.dumps(text)` between a prefix and a suffix made
once per stream; everything that does not change within a stream is encoded up front.
"""

from __future__ import annotations

from typing import Any

import orjson

from edge.api.schema import Kind
from generated import sluice_pb2 as pb

_dumps = orjson.dumps


def usage_dict(u: pb.Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_prompt_tokens},
    }


def _token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def logprob_entries(chunk: pb.TokenChunk) -> list[dict[str, Any]]:
    """Chat-style logprob entries of a chunk, one per token."""
    out = []
    for lp in chunk.logprobs:
        entry = _token(lp.text, lp.logprob)
        entry["top_logprobs"] = [_token(t.text, t.logprob) for t in lp.top]
        out.append(entry)
    return out


class ChunkFormat:
    """Renders one stream's OpenAI chunks (`edge.stream.job.Format`); subclasses fix
    the object layout."""

    object_name = ""  # of streamed chunks
    response_object = ""  # of a whole response
    logprobs = staticmethod(logprob_entries)

    def __init__(self, response_id: str, model: str, created: int, include_usage: bool) -> None:
        self.response_id = response_id
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self._head = (
            b'{"id":'
            + _dumps(response_id)
            + b',"object":'
            + _dumps(self.object_name)
            + b',"created":'
            + str(created).encode()
            + b',"model":'
            + _dumps(model)
            + b',"system_fingerprint":null,"choices":'
        )
        # OpenAI sends "usage": null on every chunk when usage was asked for.
        self._tail = b',"usage":null}' if include_usage else b"}"

    def opening(self) -> bytes | None:
        """A chunk to send as soon as the stream starts, if the format has one."""
        return None

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        raise NotImplementedError

    def finish(self, reason: str) -> bytes:
        raise NotImplementedError

    def usage(self, usage: pb.Usage) -> bytes:
        """The extra last chunk of `stream_options.include_usage`: no choices, the usage."""
        return self._head + b'[],"usage":' + _dumps(usage_dict(usage)) + b"}"

    def choice(self, text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The content fields of the one choice of a whole (non-streamed) response."""
        raise NotImplementedError

    def response(
        self, text: str, reason: str, usage: pb.Usage, logprobs: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        """A whole (non-streamed) response object."""
        return {
            "id": self.response_id,
            "object": self.response_object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, **self.choice(text, logprobs), "finish_reason": reason}],
            "usage": usage_dict(usage),
        }


class ChatFormat(ChunkFormat):
    """`chat.completion.chunk` objects; the role goes in the first delta."""

    object_name = "chat.completion.chunk"
    response_object = "chat.completion"

    def __init__(self, response_id: str, model: str, created: int, include_usage: bool) -> None:
        super().__init__(response_id, model, created, include_usage)
        self._delta_head = self._head + b'[{"index":0,"delta":{"content":'
        self._null_end = b',"finish_reason":null}]' + self._tail

    def opening(self) -> bytes:
        return (
            self._head
            + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null'
            + self._null_end
        )

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        lp = b"null" if logprobs is None else b'{"content":' + _dumps(logprobs) + b"}"
        return self._delta_head + _dumps(text) + b'},"logprobs":' + lp + self._null_end

    def finish(self, reason: str) -> bytes:
        return (
            self._head
            + b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":'
            + _dumps(reason)
            + b"}]"
            + self._tail
        )

    def choice(self, text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        return {
            "message": {"role": "assistant", "content": text},
            "logprobs": None if logprobs is None else {"content": logprobs},
        }


class CompletionFormat(ChunkFormat):
    """`text_completion` objects with the legacy logprobs layout."""

    object_name = "text_completion"
    response_object = "text_completion"

    def __init__(self, response_id: str, model: str, created: int, include_usage: bool) -> None:
        super().__init__(response_id, model, created, include_usage)
        self._text_head = self._head + b'[{"index":0,"text":'
        self._offset = 0  # characters sent so far, for logprobs.text_offset

    def _legacy_logprobs(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        offsets = []
        for e in entries:
            offsets.append(self._offset)
            self._offset += len(e["token"])
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries
            ],
            "text_offset": offsets,
        }

    def delta(self, text: str, logprobs: list[dict[str, Any]] | None) -> bytes:
        lp = b"null" if logprobs is None else _dumps(self._legacy_logprobs(logprobs))
        return (
            self._text_head
            + _dumps(text)
            + b',"logprobs":'
            + lp
            + b',"finish_reason":null}]'
            + self._tail
        )

    def finish(self, reason: str) -> bytes:
        return (
            self._text_head
            + b'"","logprobs":null,"finish_reason":'
            + _dumps(reason)
            + b"}]"
            + self._tail
        )

    def choice(self, text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        legacy = None if logprobs is None else self._legacy_logprobs(logprobs)
        return {"text": text, "logprobs": legacy}


def make_format(
    kind: Kind, request_id: str, model: str, created: int, include_usage: bool
) -> ChunkFormat:
    """The renderer for an endpoint; ids follow OpenAI's prefixes."""
    if kind == "chat":
        return ChatFormat(f"chatcmpl-{request_id}", model, created, include_usage)
    return CompletionFormat(f"cmpl-{request_id}", model, created, include_usage)
