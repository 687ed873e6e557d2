"""`engines/chat_template.render`, the chat rendering the vLLM and Triton engines share,
through SmolLM2's real Hugging Face tokenizer (the model directory of `make model`).

In `model` for the model directory and the seconds transformers takes to import.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from model_service.engines.chat_template import render
from model_service.errors import InvalidArgument
from tests.integration.conftest import _make_model

pytestmark = pytest.mark.model

USER = {"role": "user", "content": "Name a river."}


@pytest.fixture(scope="module")
def smollm() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_make_model()))


@pytest.fixture
def tokenizer(smollm: Any) -> Iterator[Any]:
    """SmolLM2's tokenizer, its own chat template back after each test."""
    template = smollm.chat_template
    yield smollm
    smollm.chat_template = template


def test_chat_ends_with_the_generation_prompt(tokenizer: Any) -> None:
    text = render(tokenizer, [USER], add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n")


def test_chat_continuation_leaves_the_final_assistant_message_open(tokenizer: Any) -> None:
    partial = {"role": "assistant", "content": "The Dan"}
    text = render(tokenizer, [USER, partial], add_generation_prompt=False)
    assert text.endswith("<|im_start|>assistant\nThe Dan")


def test_chat_without_generation_prompt_closes_a_final_user_message(tokenizer: Any) -> None:
    text = render(tokenizer, [USER], add_generation_prompt=False)
    assert text.endswith("Name a river.<|im_end|>\n")


def test_tools_reach_the_chat_template(tokenizer: Any) -> None:
    tokenizer.chat_template = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    assert render(tokenizer, [USER], True, tools) == "[weather]"


def test_a_chat_the_template_refuses_is_invalid_naming_chat_messages(tokenizer: Any) -> None:
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidArgument) as refused:
        render(tokenizer, [USER], add_generation_prompt=True)
    assert refused.value.field == "chat.messages"
    assert "roles must alternate" in str(refused.value)
