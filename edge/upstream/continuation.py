"""Continuing a generation elsewhere, pure: which requests may (`may_continue`), the
continuing `start` (chat: a final assistant message, `add_generation_prompt = false`; a
raw prompt: the text appended) and how a `final` counts for its pool."""

from __future__ import annotations

import re

import grpc

from edge.errors import from_status, from_status_code_number
from edge.obs.outcomes import CANCELLED, OK
from generated import sluice_pb2 as pb

_SUCCESS = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_TOOL_CALLS)
_CONTINUATION_ID = re.compile(r"(?s)(.+)-c[0-9]+-([0-9]+)")


def continuation_id(original: str, n: int, tokens: int) -> str:
    """The id of the `n`th continuation of `original`, after `tokens` tokens were sent:
    it says both, so whoever resumes it (any edge replica) reports the stream as one."""
    return f"{original}-c{n}-{tokens}"


def split_id(request_id: str) -> tuple[str, int]:
    """(original request id, tokens sent before it) of a generation; (id, 0) for one
    that is not a continuation."""
    m = _CONTINUATION_ID.fullmatch(request_id)
    return (m.group(1), int(m.group(2))) if m else (request_id, 0)


def whole_usage(usage: pb.Usage, base_tokens: int) -> None:
    """A continuation's usage as the whole stream's: its prompt held the `base_tokens`
    already sent, which count as completion tokens once."""
    if base_tokens:
        usage.completion_tokens += base_tokens
        usage.prompt_tokens = max(0, usage.prompt_tokens - base_tokens)


def constrained(start: pb.StartGeneration) -> bool:
    """Whether the generation carries state a continuation cannot take along: a grammar's
    (structured output, a required or named tool choice), a tool-call parser's, or
    several choices'. Such a stream ends with a retryable error event instead."""
    if start.HasField("structured_output") or start.sampling.n > 1:
        return True
    chat = start.chat if start.WhichOneof("input") == "chat" else None
    if chat is None or not chat.tools:
        return False
    return not (
        chat.tool_choice.WhichOneof("choice") == "mode"
        and chat.tool_choice.mode == pb.TOOL_MODE_NONE
    )


def may_continue(mode: str, start: pb.StartGeneration) -> bool:
    """Whether a broken stream of `start` may be continued elsewhere.

    "sampled": only a sampled request without a seed (its text was one random draw; a
    continuation is as valid a draw). "always": greedy and seeded ones too (greedy goes on
    with the same text on the same model, up to tokenization at the cut; a seeded one loses
    its reproducibility). "never": no continuation. Never a prompt given as token ids
    (the edge has no tokenizer to append the text sent).
    """
    if constrained(start):
        return False
    if start.WhichOneof("input") == "prompt_tokens":  # no tokenizer here to extend it
        return False
    chat = start.chat if start.WhichOneof("input") == "chat" else None
    if chat is not None and chat.HasField("add_generation_prompt"):
        # Without a generation prompt the reply is no assistant turn (or extends the final
        # message, when continuing it): only that last case has a text to extend.
        if not chat.add_generation_prompt and not chat.continue_final_message:
            return False
    if mode == "always":
        return True
    if mode != "sampled":
        return False
    sampling = start.sampling
    greedy = sampling.HasField("temperature") and sampling.temperature == 0
    return not greedy and not sampling.HasField("seed")


def continuation_start(
    original: pb.StartGeneration, text: str, tokens: int, n: int
) -> pb.StartGeneration:
    """The `start` that goes on from `text` (`tokens` tokens) already sent to the client."""
    start = pb.StartGeneration()
    start.CopyFrom(original)
    start.request_id = continuation_id(original.request_id, n, tokens)
    if start.WhichOneof("input") == "chat":
        chat = start.chat
        if chat.continue_final_message:  # a prefill: the final message grows
            chat.messages[-1].content += text
        else:
            chat.messages.add(role="assistant", content=text)
        chat.add_generation_prompt = False
        chat.continue_final_message = True
    else:
        start.prompt = original.prompt + text
    sp = start.sampling
    start.return_prompt_tokens = start.return_prompt_text = False  # sent before any token
    sp.ClearField("prompt_logprobs")
    if sp.HasField("max_tokens"):
        sp.max_tokens = max(0, sp.max_tokens - tokens)
    sp.min_tokens = max(0, sp.min_tokens - tokens)
    return start


def final_outcome(final: pb.Final) -> str:
    if final.reason in _SUCCESS:
        return OK
    if final.reason == pb.FINISH_REASON_CANCELLED:
        return CANCELLED
    code = from_status_code_number(final.error.code) if final.error.code else None
    return from_status(code or grpc.StatusCode.UNKNOWN, "").code or "upstream_error"
