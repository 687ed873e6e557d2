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
