"""A chat rendered as text through the model's Hugging Face chat template, for every engine
that serves a chat (vLLM, Triton): the worker owns the template."""

from __future__ import annotations

from typing import Any

from model_service.errors import InvalidArgument


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """`messages` (and `tools`), as the template takes them, rendered as the prompt text;
    InvalidArgument naming `chat.messages` when the template refuses them."""
    # A final assistant message without a generation prompt is a prefix to continue
    # (failover continuations): leave that turn open instead of closing it.
    continue_final = not add_generation_prompt and messages[-1]["role"] == "assistant"
    try:
        return str(
            tokenizer.apply_chat_template(
                messages,
                tools=tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final,
            )
        )
    except Exception as exc:  # a template may reject a role order, e.g. jinja raise_exception
        raise InvalidArgument(
            "chat.messages", f"chat template refused the messages: {exc}"
        ) from exc
