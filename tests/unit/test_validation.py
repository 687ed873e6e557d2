"""Every invalid input is refused with INVALID_ARGUMENT naming its field."""

import math

import pytest

from model_service.config import EngineConfig
from model_service.config import LimitsConfig as Limits
from model_service.errors import InvalidArgument, NotFound
from model_service.intake.validation import resolve_max_tokens, validate_request
from model_service.types import ChatMessage, GenerationRequest, ModelInfo, SamplingParams

MODEL = ModelInfo(id="m", max_model_len=100, engine="sim", default_max_tokens=50)


def req(prompt="hi", messages=None, **sp):
    return GenerationRequest(
        request_id="r", prompt=prompt, messages=messages, sampling=SamplingParams(**sp)
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (req(prompt=""), "prompt"),
        (req(prompt="x" * 2000), "prompt"),
        (req(prompt=None, messages=()), "chat.messages"),
        (req(prompt=None, messages=(ChatMessage("wizard", "x"),)), "chat.messages[0].role"),
        (req(max_tokens=0), "sampling.max_tokens"),
        (req(max_tokens=100), "sampling.max_tokens"),
        (req(temperature=math.nan), "sampling.temperature"),
        (req(temperature=-0.5), "sampling.temperature"),
        (req(top_p=0.0), "sampling.top_p"),
        (req(top_p=1.5), "sampling.top_p"),
        (req(top_k=-1), "sampling.top_k"),
        (req(presence_penalty=3), "sampling.presence_penalty"),
        (req(stop=("a",) * 17), "sampling.stop"),
        (req(stop=("ok", "")), "sampling.stop[1]"),
        (req(n=17), "sampling.n"),
        (req(n=0), "sampling.n"),
        (req(min_p=1.5), "sampling.min_p"),
        (req(stop_token_ids=tuple(range(65))), "sampling.stop_token_ids"),
        (req(logit_bias=((5, 101.0),)), "sampling.logit_bias[5]"),
        (req(logprobs=21), "sampling.logprobs"),
    ],
)
def test_invalid_field_is_named(request_, field):
    with pytest.raises(InvalidArgument) as e:
        validate_request(request_, MODEL, Limits(max_prompt_bytes=1000))
    assert e.value.field == field
    assert field in e.value.message


def test_valid_request_passes():
    validate_request(req(temperature=0.7, top_p=0.9, stop=("\n",), max_tokens=10), MODEL, Limits())


def test_unknown_model_is_not_found():
    r = req()
    r.model = "other"
    with pytest.raises(NotFound):
        validate_request(r, MODEL, Limits())


def test_max_tokens_fits_context_window():
    assert resolve_max_tokens(req(), MODEL, 10) == 50  # default
    assert resolve_max_tokens(req(), MODEL, 80) == 20  # capped by room
    assert resolve_max_tokens(req(max_tokens=30), MODEL, 70) == 30
    with pytest.raises(InvalidArgument) as e:
        resolve_max_tokens(req(max_tokens=31), MODEL, 70)
    assert e.value.field == "sampling.max_tokens"
    with pytest.raises(InvalidArgument) as e:
        resolve_max_tokens(req(), MODEL, 100)
    assert e.value.field == "prompt"


def test_without_max_tokens_the_rest_of_the_context_as_vllm() -> None:
    uncapped = ModelInfo(id="m", max_model_len=100, engine="sim", default_max_tokens=0)
    assert resolve_max_tokens(req(), uncapped, 10) == 90
    assert resolve_max_tokens(req(), uncapped, 99) == 1
    assert resolve_max_tokens(req(max_tokens=5), uncapped, 10) == 5
    assert EngineConfig().default_max_tokens == 0  # no cap unless configured


def chat_start(**inputs):
    """A StartGeneration of one user message and these ChatInput template inputs."""
    from generated import sluice_pb2 as pb

    start = pb.StartGeneration(request_id="r")
    start.chat.messages.add(role="user", content="hi")
    for name, value in inputs.items():
        if name == "documents":
            for d in value:
                start.chat.documents.add().fields.update(d)
        elif name == "tools":
            for t in value:
                start.chat.tools.add(**t)
        elif name == "arguments":  # a history tool call's
            start.chat.messages.add(role="assistant").tool_calls.add(name="f", arguments=value)
        else:
            setattr(start.chat, name, value)
    return start


@pytest.mark.parametrize(
    ("inputs", "field", "says"),
    [
        ({"continue_final_message": True}, "chat.continue_final_message", "Cannot set both"),
        ({"template_kwargs_json": "[1]"}, "chat.template_kwargs_json", "JSON object"),
        ({"template_kwargs_json": "{"}, "chat.template_kwargs_json", "JSON"),
        (
            {"template_kwargs_json": '{"tools": [], "tokenize": true, "x": 1}'},
            "chat.template_kwargs_json",
            "tokenize, tools: the template's own parameters",
        ),
        ({"documents": [{"text": "d"}] * 129}, "chat.documents", "at most 128 documents"),
        ({"documents": [{"text": "d" * 1000}]}, "chat.messages", "exceeds 1000 bytes"),
        # Rendered into the prompt too: a history call's arguments, the tools' descriptions.
        ({"arguments": '"' + "a" * 1000 + '"'}, "chat.messages", "exceeds 1000 bytes"),
        (
            {"tools": [{"name": n, "description": "d" * 500} for n in "fg"]},
            "chat.tools",
            "with the tools' descriptions exceeds 1000 bytes",
        ),
    ],
)
def test_chat_template_inputs_are_checked(inputs, field, says):
    """The template's other inputs, decoded from the contract, refused naming the field."""
    from model_service.intake.decode import request_from_pb

    with pytest.raises(InvalidArgument) as e:
        validate_request(
            request_from_pb(chat_start(**inputs)), MODEL, Limits(max_prompt_bytes=1000)
        )
    assert (e.value.field, says in e.value.message) == (field, True)


def test_template_variables_may_repeat_the_requests_own_fields_as_vllms():
    """vLLM takes `add_generation_prompt`, `continue_final_message` and `documents` among
    `chat_template_kwargs` (its request's fields win at rendering): accepted."""
    from model_service.intake.decode import request_from_pb

    kwargs = '{"add_generation_prompt": false, "continue_final_message": true, "documents": []}'
    req = request_from_pb(chat_start(template_kwargs_json=kwargs))
    validate_request(req, MODEL, Limits(max_prompt_bytes=1000))
    assert (req.add_generation_prompt, req.continue_final_message) == (True, False)


def test_continue_final_message_follows_the_contracts_older_form_when_unset():
    """Unset: a final assistant message without a generation prompt is continued (what
    failover continuations send); set, it says so either way."""
    from model_service.intake.decode import request_from_pb

    def decoded(**inputs):
        start = chat_start(**inputs)
        start.chat.messages.add(role="assistant", content="The")
        r = request_from_pb(start)
        return r.add_generation_prompt, r.continue_final_message

    assert [
        decoded(),
        decoded(add_generation_prompt=False),
        decoded(add_generation_prompt=False, continue_final_message=False),
        decoded(add_generation_prompt=True, continue_final_message=False),
    ] == [(True, False), (False, True), (False, False), (True, False)]
