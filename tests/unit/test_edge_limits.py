"""Token bucket math, the prompt limit, the histogram exposition, route labels."""

from __future__ import annotations

import pytest

from edge.api.responses import parse_responses
from edge.api.schema import GenRequest, parse_chat
from edge.api.sizes import check_sizes
from edge.config import SecurityConfig
from edge.errors import ApiError
from edge.obs.metrics import Metrics
from edge.obs.record import RouteLabels
from edge.security.limits import TokenBucket
from generated import sluice_pb2 as pb
from sluice_common.histogram import Histogram


def test_token_bucket_allows_a_burst_then_the_rate():
    b = TokenBucket(rate=2.0, burst=3.0)
    assert [b.take(10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take(10.0) == pytest.approx(0.5)  # one token takes 1/rate
    assert b.take(10.25) == pytest.approx(0.25)  # half refilled
    assert b.take(10.5) == 0.0
    assert b.take(100.0) == 0.0 and b.tokens == pytest.approx(2.0)  # capped at the burst


def _refusal(req: GenRequest, body: dict, limits: SecurityConfig) -> tuple | None:
    try:
        check_sizes(req, body, limits)
    except ApiError as err:
        return err.status, err.param, err.code, err.message
    return None


def test_prompt_limit_names_the_parameter():
    chat = GenRequest(
        kind="chat",
        messages=[
            pb.ChatMessage(role="system", content="a" * 6),
            pb.ChatMessage(role="user", content="b" * 5),
        ],
    )
    assert _refusal(chat, {}, SecurityConfig(max_prompt_chars=11)) is None
    assert _refusal(chat, {}, SecurityConfig(max_prompt_chars=0)) is None  # off
    assert _refusal(chat, {}, SecurityConfig(max_prompt_chars=10)) == (
        400,
        "messages",
        "prompt_too_long",
        "'messages' holds 11 characters, more than this server's limit of 10",
    )
    completion = GenRequest(kind="completion", prompt="p" * 3)
    assert _refusal(completion, {}, SecurityConfig(max_prompt_chars=2))[1] == "prompt"


def _tool(name: str, description: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description}}


def test_tool_limits_name_the_field_and_the_limit():
    """The number of tools, their definitions' characters and each history call's
    arguments, for chat and Responses bodies alike; 0 turns a size limit off."""
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]" * 4}}]
    chat = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": calls},
        ],
        "tools": [_tool("f", "d" * 9), _tool("g", "")],
    }
    req = parse_chat(chat)  # definitions: 1 + 9 + 1 characters, arguments: 12
    assert _refusal(req, chat, SecurityConfig(max_tools_chars=11, max_arguments_chars=12)) is None
    assert _refusal(req, chat, SecurityConfig(max_tools=1)) == (
        400,
        "tools",
        "too_large",
        "'tools' has 2 entries, more than this server's limit of 1",
    )
    assert _refusal(req, chat, SecurityConfig(max_tools_chars=10)) == (
        400,
        "tools",
        "too_large",
        "the tool definitions hold 11 characters, more than this server's limit of 10",
    )
    param = "messages[1].tool_calls[0].function.arguments"
    assert _refusal(req, chat, SecurityConfig(max_arguments_chars=11)) == (
        400,
        param,
        "too_large",
        f"'{param}' holds 12 characters, more than this server's limit of 11",
    )
    off = SecurityConfig(max_tools_chars=0, max_arguments_chars=0)
    assert _refusal(req, chat, off) is None
    responses = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}" * 5},
        ],
        "tools": [{"type": "function", "name": "f", "description": "d" * 9}],
    }
    req = parse_responses(responses)
    assert _refusal(req, responses, SecurityConfig(max_arguments_chars=9))[1:3] == (
        "input[1].arguments",
        "too_large",
    )
    assert _refusal(req, responses, SecurityConfig(max_tools_chars=9))[1] == "tools"


def test_histogram_exposition_is_cumulative_with_inclusive_bounds():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    assert h.samples("x_seconds", 'route="/a"') == [
        'x_seconds_bucket{route="/a",le="0.1"} 2',
        'x_seconds_bucket{route="/a",le="1.0"} 3',
        'x_seconds_bucket{route="/a",le="+Inf"} 4',
        'x_seconds_sum{route="/a"} 7.65',
        'x_seconds_count{route="/a"} 4',
    ]
    assert Histogram((1.0,)).samples("y")[0] == 'y_bucket{le="1.0"} 0'


def test_routes_with_parameters_are_labelled_by_template():
    route = RouteLabels(["/v1/models", "/v1/streams/{token}"])
    assert route("/v1/models") == "/v1/models"
    assert route("/v1/streams/abc.def") == "/v1/streams/{token}"
    assert route("/v1/streams/a/b") == "other"
    text = Metrics().render(0).decode()
    for family in (
        "sluice_edge_time_to_first_token_seconds histogram",
        "sluice_edge_inter_token_latency_seconds histogram",
        "sluice_edge_write_overhead_seconds histogram",
        "sluice_edge_resumes_total counter",
        "sluice_edge_admission_rejections_total counter",
        "sluice_edge_auth_failures_total counter",
    ):
        assert f"# TYPE {family}" in text
