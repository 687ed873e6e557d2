"""Signed event ids and stream links: round trips, owner binding, every forgery refused."""

import base64
import time

import pytest

from edge.errors import ApiError
from edge.stream.ids import Origin, ResumeCodec
from edge.upstream.worker import worker_key

CODEC = ResumeCodec(b"k" * 32)
W = worker_key("10.0.0.7:50051")
OWNER, BODY = CODEC.tag("alice"), CODEC.tag(b"chat|request bytes")


def origin(request_id: str = "abc", worker: str = W) -> Origin:
    return Origin(request_id, worker, OWNER, BODY)


def event_id(tail: bytes, o: Origin | None = None) -> str:
    return (CODEC.prefix(o or origin()) + tail).decode()


@pytest.mark.parametrize("request_id", ["req:with/odd+chars", "0123456789abcdef" * 2, "ab-c1"])
def test_event_id_round_trip_with_part(request_id: str):
    for tail, want in ((b"12.9", (12, 9, 0)), (b"14.20~2", (14, 20, 2)), (b"3.4~3", (3, 4, 3))):
        token = event_id(tail, origin(request_id))
        assert "\n" not in token and ":" not in token and "10.0.0.7" not in token
        p = CODEC.parse(token)
        assert p.origin == Origin(request_id, W, OWNER, BODY)
        assert (p.request_id, p.worker) == (request_id, W)
        assert (p.seq, p.cursor, p.part) == want


def test_edge_request_ids_make_short_tokens():
    token = event_id(b"1.2", origin("0123456789abcdef" * 2))
    assert len(token.split(".")[0]) == 51


def test_tags_differ_by_principal_and_by_secret():
    assert CODEC.tag("alice") != CODEC.tag("bob")
    assert ResumeCodec(b"z" * 32).tag("alice") != CODEC.tag("alice")


def _flip(token: str, at: int) -> str:
    head, rest = token.split(".", 1)
    c = "A" if head[at] != "A" else "B"
    return head[:at] + c + head[at + 1 :] + "." + rest


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: _flip(t, 3),  # the MAC
        lambda t: _flip(t, 20),  # the worker
        lambda t: _flip(t, 23),  # the owner tag
        lambda t: _flip(t, 27),  # the body tag
        lambda t: _flip(t, 31),  # the request id
        lambda t: event_id(b"3.4", origin("abd")).split(".")[0][:20] + t[20:],  # spliced
        lambda t: t + ".5",
        lambda t: t.rsplit(".", 1)[0] + ".x",
        lambda t: t + "~0",
        lambda t: t + "~1000",
        lambda _: "",
        lambda _: "garbage",
        # Regressions: each of these was a 500 (TypeError / ValueError) instead of a 400.
        lambda t: "é" * 10 + t[10:],  # non-ASCII token
        lambda t: t.rsplit(".", 2)[0] + ".²." + t.rsplit(".", 1)[1],  # "²".isdigit()
        lambda t: t.rsplit(".", 1)[0] + "." + "9" * 30,  # past any index
        lambda t: "A" * 5 + "." + t.split(".", 1)[1],  # a token too short to hold a MAC
    ],
)
def test_forged_or_malformed_ids_are_refused(mutate):
    token = event_id(b"3.4")
    with pytest.raises(ApiError) as e:
        CODEC.parse(mutate(token))
    assert e.value.status == 400 and e.value.param == "Last-Event-ID"


def test_other_secret_refuses():
    with pytest.raises(ApiError):
        ResumeCodec(b"z" * 32).parse(event_id(b"3.4"))


def test_stream_link_round_trip_forgery_and_expiry():
    token, expires = CODEC.stream_token(origin("gen-1"), ttl_s=60)
    assert expires > time.time()
    assert CODEC.open_stream(token) == origin("gen-1")
    head, exp = token.split(".")
    with pytest.raises(ApiError) as e:  # extending the expiry breaks the signature
        CODEC.open_stream(f"{head}.{int(exp) + 1000}")
    assert e.value.status == 404
    old, _ = CODEC.stream_token(origin("gen-1"), ttl_s=-1)
    with pytest.raises(ApiError) as e:
        CODEC.open_stream(old)
    assert e.value.status == 410
    # An event id's signature is not a stream link's.
    with pytest.raises(ApiError):
        CODEC.open_stream(event_id(b"1.2", origin("gen-1")).rsplit(".", 1)[0])


def test_non_ascii_stream_link_is_not_found_not_a_crash():
    token, _ = CODEC.stream_token(origin("gen-1"), ttl_s=60)
    head, exp = token.split(".")
    with pytest.raises(ApiError) as e:
        CODEC.open_stream(f"{'é' * len(head)}.{exp}")
    assert e.value.status == 404


def test_a_stream_links_request_id_cannot_leak_into_its_expiry():
    """Review finding: with nothing between the request id and the expiry under the MAC,
    the id's last byte could be moved into the expiry (a link that never expires)."""
    token, _ = CODEC.stream_token(origin("ab-c1-42"), ttl_s=60)
    head, exp = token.split(".")
    raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
    moved = chr(raw[-1]) + exp  # "2" + the expiry: still all digits
    shorter = base64.urlsafe_b64encode(raw[:-1]).rstrip(b"=").decode()
    with pytest.raises(ApiError) as e:
        CODEC.open_stream(f"{shorter}.{moved}")
    assert e.value.status == 404


def test_tags_of_the_wrong_size_are_refused_when_signing():
    with pytest.raises(ValueError):
        CODEC.prefix(Origin("abc", W, OWNER, b"x"))
