"""Drop-in for vLLM's OpenAI server (issue 24): the edge's answers to what vLLM's clients
send, checked field by field against what vLLM's request models do."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from edge.api.schema import decode_body, parse_chat
from edge.errors import ApiError

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def refusal(body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_chat(decode_body(orjson.dumps(body)))
    return info.value


@pytest.mark.parametrize(
    "raw",
    [b"9223372036854775808", b"-9223372036854775809", b"18446744073709551615", b"-1e20"],
)
def test_seed_outside_int64_is_refused_naming_seed(raw: bytes) -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":' + raw + b"}"
    with pytest.raises(ApiError) as info:
        parse_chat(decode_body(body))
    assert (info.value.status, info.value.param) == (400, "seed")
    assert "seed" in info.value.message


@pytest.mark.parametrize(
    ("seed", "carried"),
    [(2**63 - 1, 2**63 - 1), (-(2**63), 2**63), (-1, 2**64 - 1), (7.0, 7)],
)
def test_seed_inside_int64_is_carried_as_uint64(seed: int | float, carried: int) -> None:
    assert parse_chat(decode_body(orjson.dumps({**CHAT, "seed": seed}))).seed == carried


def test_logit_bias_error_names_every_bad_key() -> None:
    err = refusal({**CHAT, "logit_bias": {"x": 1, "5": 2, "-3": 1, "abc": 0}})
    assert (err.status, err.param) == (400, "logit_bias")
    assert "logit_bias" in err.message
    for key in ("'x'", "'-3'", "'abc'"):
        assert key in err.message
    assert "'5'" not in err.message


def test_logit_bias_bias_error_names_every_bad_key() -> None:
    err = refusal({**CHAT, "logit_bias": {"1": 101, "2": 0, "3": -200, "4": "x"}})
    assert (err.status, err.param) == (400, "logit_bias")
    assert all(f"'{k}'" in err.message for k in ("1", "3", "4"))
    assert "'2'" not in err.message
