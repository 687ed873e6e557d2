"""`engines/chat_template.render`, the chat rendering the vLLM and Triton engines share,
through SmolLM2's real Hugging Face tokenizer (the model directory of `make model`).

In `model` for the model directory and the seconds transformers takes to import.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from generated import sluice_pb2 as pb
from model_service.engines.chat_template import render
from model_service.errors import InvalidArgument
from model_service.intake.decode import request_from_pb
from model_service.types import GenerationRequest
from tests.integration.conftest import _make_model
from tests.unit.test_validation import chat_start

pytestmark = pytest.mark.model

USER = {"role": "user", "content": "Name a river."}


def chat(messages: list[dict[str, Any]], **inputs: Any) -> GenerationRequest:
    """The domain request of a ChatInput with these messages and template inputs, as the
    worker decodes it from the contract."""
    start = chat_start(**inputs)
    del start.chat.messages[:]
    start.chat.messages.extend(pb.ChatMessage(**m) for m in messages)
    return request_from_pb(start)


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
    text = render(tokenizer, [USER], chat([USER]))
    assert text.endswith("<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n")


def test_chat_continuation_leaves_the_final_assistant_message_open(tokenizer: Any) -> None:
    partial = {"role": "assistant", "content": "The Dan"}
    text = render(tokenizer, [USER, partial], chat([USER, partial], add_generation_prompt=False))
    assert text.endswith("<|im_start|>assistant\nThe Dan")


def test_chat_continue_final_message_false_closes_the_final_assistant_message(
    tokenizer: Any,
) -> None:
    partial = {"role": "assistant", "content": "The Dan"}
    req = chat([USER, partial], add_generation_prompt=False, continue_final_message=False)
    assert render(tokenizer, [USER, partial], req).endswith("assistant\nThe Dan<|im_end|>\n")


def test_documents_and_template_variables_reach_the_chat_template(tokenizer: Any) -> None:
    tokenizer.chat_template = (
        "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}{{ greeting }}"
    )
    docs = [{"title": "Nile", "text": "A river."}, {"title": "Dan", "text": "Another."}]
    req = chat([USER], documents=docs, template_kwargs_json='{"greeting": "hi"}')
    assert render(tokenizer, [USER], req) == "[Nile: A river.][Dan: Another.]hi"


def test_template_variables_named_as_the_requests_fields_yield_to_them(tokenizer: Any) -> None:
    """vLLM's merge: `add_generation_prompt` and `continue_final_message` among the extra
    variables are overridden by the request's own (set or default); `documents` there
    reach the template when the request has none, and yield to the request's."""
    partial = {"role": "assistant", "content": "The Dan"}
    flags = '{"add_generation_prompt": false, "continue_final_message": true}'
    plain = render(tokenizer, [USER], chat([USER]))
    assert render(tokenizer, [USER], chat([USER], template_kwargs_json=flags)) == plain
    opened = chat([USER, partial], add_generation_prompt=False, continue_final_message=True)
    closed = chat([USER, partial], add_generation_prompt=False, template_kwargs_json=flags)
    closed.continue_final_message = False  # the request's own: unset in vLLM is False
    texts = [render(tokenizer, [USER, partial], r) for r in (opened, closed)]
    assert [t.endswith("The Dan") for t in texts] == [True, False]
    tokenizer.chat_template = "{% for d in documents %}[{{ d.text }}]{% endfor %}"
    given = '{"documents": [{"text": "kw"}]}'
    kw_only = chat([USER], template_kwargs_json=given)
    both = chat([USER], template_kwargs_json=given, documents=[{"text": "own"}])
    assert [render(tokenizer, [USER], r) for r in (kw_only, both)] == ["[kw]", "[own]"]


def test_chat_without_generation_prompt_closes_a_final_user_message(tokenizer: Any) -> None:
    text = render(tokenizer, [USER], chat([USER], add_generation_prompt=False))
    assert text.endswith("Name a river.<|im_end|>\n")


def test_tools_reach_the_chat_template(tokenizer: Any) -> None:
    tokenizer.chat_template = "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    assert render(tokenizer, [USER], chat([USER]), tools) == "[weather]"


def test_a_chat_the_template_refuses_is_invalid_naming_chat_messages(tokenizer: Any) -> None:
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(InvalidArgument) as refused:
        render(tokenizer, [USER], chat([USER]))
    assert refused.value.field == "chat.messages"
    assert "roles must alternate" in str(refused.value)
