"""Token bucket math, the prompt limit, the histogram exposition, route labels."""

from __future__ import annotations

import pytest

from edge.api.schema import GenRequest, check_prompt
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


def test_prompt_limit_names_the_parameter():
    chat = GenRequest(
        kind="chat",
        messages=[
            pb.ChatMessage(role="system", content="a" * 6),
            pb.ChatMessage(role="user", content="b" * 5),
        ],
    )
    check_prompt(chat, 11)
    check_prompt(chat, 0)  # off
    with pytest.raises(ApiError) as err:
        check_prompt(chat, 10)
    assert (err.value.status, err.value.param, err.value.code) == (
        400,
        "messages",
        "prompt_too_long",
    )
    with pytest.raises(ApiError) as err:
        check_prompt(GenRequest(kind="completion", prompt="p" * 3), 2)
    assert err.value.param == "prompt"


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
