"""Signed event ids and stream links: round trips, and every forgery refused."""

import time

import pytest

from edge.errors import ApiError
from edge.stream.ids import ResumeCodec
from edge.upstream.worker import worker_key

CODEC = ResumeCodec(b"k" * 32)
W = worker_key("10.0.0.7:50051")


def test_event_id_round_trip_with_part():
    prefix = CODEC.prefix("req:with/odd+chars", W)
    for tail, want in ((b"12.9", (12, 9, 0)), (b"14.20~2", (14, 20, 2))):
        token = (prefix + tail).decode()
        assert "\n" not in token and ":" not in token and "10.0.0.7" not in token
        p = CODEC.parse(token)
        assert (p.request_id, p.worker) == ("req:with/odd+chars", W)
        assert (p.seq, p.cursor, p.part) == want


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.replace(t.split(".")[0], "b3RoZXI"),  # another request id
        lambda t: t.replace(W, worker_key("evil:1")),  # another worker
        lambda t: t[: t.index(".", t.index(".") + 1) + 1] + "AAAAAAAAAAAAAAAA." + "1.2",  # sig
        lambda t: t + ".5",
        lambda t: t.rsplit(".", 1)[0] + ".x",
        lambda t: t + "~9",
        lambda _: "",
        lambda _: "garbage",
        # Regressions: each of these was a 500 (TypeError / ValueError) instead of a 400.
        lambda t: t.replace(t.split(".")[2], "é" * len(t.split(".")[2])),  # non-ASCII sig
        lambda t: t.rsplit(".", 2)[0] + ".²." + t.rsplit(".", 1)[1],  # "²".isdigit()
        lambda t: t.rsplit(".", 1)[0] + "." + "9" * 30,  # past any index
    ],
)
def test_forged_or_malformed_ids_are_refused(mutate):
    token = (CODEC.prefix("abc", W) + b"3.4").decode()
    with pytest.raises(ApiError) as e:
        CODEC.parse(mutate(token))
    assert e.value.status == 400 and e.value.param == "Last-Event-ID"


def test_other_secret_refuses():
    token = (CODEC.prefix("abc", W) + b"3.4").decode()
    with pytest.raises(ApiError):
        ResumeCodec(b"z" * 32).parse(token)


def test_stream_link_round_trip_forgery_and_expiry():
    token, expires = CODEC.stream_token("gen-1", W, ttl_s=60)
    assert expires > time.time()
    assert CODEC.open_stream(token) == ("gen-1", W)
    rid, worker, exp, sig = token.split(".")
    with pytest.raises(ApiError) as e:  # extending the expiry breaks the signature
        CODEC.open_stream(f"{rid}.{worker}.{int(exp) + 1000}.{sig}")
    assert e.value.status == 404
    old, _ = CODEC.stream_token("gen-1", W, ttl_s=-1)
    with pytest.raises(ApiError) as e:
        CODEC.open_stream(old)
    assert e.value.status == 410
    # An event id's signature is not a stream link's.
    with pytest.raises(ApiError):
        CODEC.open_stream((CODEC.prefix("gen-1", W) + b"1.2").decode())


def test_non_ascii_stream_link_is_not_found_not_a_crash():
    token, _ = CODEC.stream_token("gen-1", W, ttl_s=60)
    rid, worker, exp, sig = token.split(".")
    with pytest.raises(ApiError) as e:
        CODEC.open_stream(f"{rid}.{worker}.{exp}.{'é' * len(sig)}")
    assert e.value.status == 404
