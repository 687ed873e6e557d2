"""The `/v1/completions` prompt's forms: a string or token ids; OpenAI's one-element
batch forms (`["text"]`, `[[1, 2]]`) are the same."""

from __future__ import annotations

from typing import Any

from edge.errors import invalid

UINT32_MAX = 2**32 - 1


def _is_token_id(v: Any) -> bool:
    return type(v) is int and 0 <= v <= UINT32_MAX


def read(body: dict[str, Any]) -> str | list[int]:
    """The prompt: a string, or token ids; OpenAI's one-element batch forms (`["text"]`,
    `[[1, 2]]`) are the same. A batch of several is refused by name (not yet served)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if prompt is None:
        raise invalid("prompt", "'prompt' is required")
    if isinstance(prompt, list):
        if prompt and all(_is_token_id(v) for v in prompt):
            return prompt
        if prompt and all(isinstance(v, (str, list)) for v in prompt):
            raise invalid(
                "prompt",
                f"'prompt' is a batch of {len(prompt)} prompts: send one prompt per request "
                "(batches are not served yet)",
            )
        raise invalid(
            "prompt",
            "'prompt' must be a string or a non-empty list of token ids (integers from 0 "
            f"to {UINT32_MAX})",
        )
    if not isinstance(prompt, str):
        raise invalid("prompt", "'prompt' must be a string or a list of token ids")
    if not prompt:
        raise invalid("prompt", "'prompt' must not be empty")
    return prompt
