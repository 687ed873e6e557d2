"""Background Responses (`background: true`) through the official `openai` SDK: two edge
replicas sharing a real Redis in front of one sim worker. A background response is polled,
streamed, cut and resumed (`starting_after`) and cancelled through either replica; it
outlives the edge that started it (another replica follows it once its run lease lapsed);
another key sees none of it; bad input is a 400 naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.integration.edge_fixtures import EDGE_ENV, parse_sse, wait_ready
from tests.procs import Proc, start_edge, start_worker
from tests.redis_proc import redis_server
from tests.waits import eventually

KEYS = {"ann": "sk-ann-background-0123456789", "bob": "sk-bob-background-0123456789"}
ENV = {**EDGE_ENV, "SLUICE_API_KEYS": ",".join(f"{n}:{k}" for n, k in KEYS.items())}
GREEDY: Any = {"model": "", "temperature": 0, "max_output_tokens": 12}
# ~4 s at 2 ms a token: the sim runs to max_output_tokens.
LONG: Any = {"model": "", "temperature": 0, "max_output_tokens": 1800,
             "extra_body": {"ignore_eos": True}}  # fmt: skip


class Fleet:
    def __init__(self, redis_url: str, worker: Proc) -> None:
        self.redis_url, self.worker = redis_url, worker
        self.edges: list[Proc] = []

    def add_edge(self) -> str:
        edge = start_edge("--worker", self.worker.address, "--store-url", self.redis_url,
                          env=ENV)  # fmt: skip
        self.edges.append(edge)
        base = f"http://{edge.address}"
        wait_ready(base)
        return base


@contextmanager
def _fleet(redis_url: str, worker: Proc) -> Iterator[Fleet]:
    f = Fleet(redis_url, worker)
    try:
        f.add_edge()
        f.add_edge()
        yield f
    finally:
        for e in f.edges:
            e.kill()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as redis:
        yield redis.url


@pytest.fixture(scope="module")
def fleet(redis_url: str) -> Iterator[Fleet]:
    worker = start_worker("--engine", "sim", "--sim-token-delay", "0.002")
    try:
        with _fleet(redis_url, worker) as f:
            yield f
    finally:
        worker.kill()


@pytest.fixture(scope="module")
def model_fleet(redis_url: str, vllm_worker: Proc) -> Iterator[Fleet]:
    with _fleet(redis_url, vllm_worker) as f:
        yield f


def _base(fleet: Fleet, i: int) -> str:
    return f"http://{fleet.edges[i].address}"


def _client(base: str, who: str = "ann") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS[who], max_retries=0)


def _sse(base: str, path: str) -> list[bytes]:
    """A stream's events as the bytes that made each (the reconnect hint left out)."""
    headers = {"authorization": f"Bearer {KEYS['ann']}"}
    with httpx.stream("GET", f"{base}{path}", headers=headers, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        raw = b"".join(resp.iter_bytes())
    assert raw.startswith(b"retry: 3000\n")
    return raw.removeprefix(b"retry: 3000\n").split(b"\n\n")[:-1]


def _done(client: openai.OpenAI, response_id: str) -> Any:
    return eventually(
        lambda: (
            (r := client.responses.retrieve(response_id)).status != "in_progress"
            and r.status != "queued"
            and r
        ),
        what=f"{response_id} ended",
    )


def test_polled_on_the_other_replica_it_answers_as_a_foreground_response(fleet: Fleet) -> None:
    one, two = _client(_base(fleet, 0)), _client(_base(fleet, 1))
    started = one.responses.create(**GREEDY, input="Tell me about rivers.", background=True)
    assert (started.status, started.background, started.output) == ("queued", True, [])
    done = _done(two, started.id)
    plain = one.responses.create(**GREEDY, input="Tell me about rivers.")
    assert (done.status, done.output_text) == (plain.status, plain.output_text)
    assert done.usage.model_dump() == plain.usage.model_dump()  # type: ignore[union-attr]
    # A finished one is stored as any other: its input, a chain from it.
    assert [i.role for i in two.responses.input_items.list(started.id).data] == ["user"]  # type: ignore[union-attr]
    chained = one.responses.create(**GREEDY, input="More.", previous_response_id=started.id)
    u, c = done.usage, chained.usage
    assert c.input_tokens > u.input_tokens + u.output_tokens  # type: ignore[union-attr]


def _cut_and_resume(fleet: Fleet, body: dict[str, Any], cut: int) -> Any:
    """Read a background stream through the SDK on one replica, leave after `cut`
    events, resume it on the other: the events of an uncut read, byte for byte. Returns
    the response as polled."""
    one, two = _client(_base(fleet, 0)), _client(_base(fleet, 1))
    with one.responses.create(**body, background=True, stream=True) as s:
        got = []
        for event in s:
            got.append(event)
            if len(got) == cut:
                break  # the client goes; the response runs on
    response_id = got[0].response.id  # type: ignore[union-attr]
    assert [e.sequence_number for e in got] == list(range(cut))
    done = _done(two, response_id)
    path = f"/v1/responses/{response_id}?stream=true"
    whole = _sse(_base(fleet, 0), path)
    rest = _sse(_base(fleet, 1), f"{path}&starting_after={cut - 1}")
    assert whole[cut:] == rest  # ids, names and data, as the uncut read made them
    events = [parse_sse(e + b"\n\n")[0] for e in whole]
    assert [orjson.loads(e["data"]) for e in events[:cut]] == [e.to_dict() for e in got]
    assert events[-1]["event"] == f"response.{done.status}"
    # Through the SDK on the other replica: the same events, then the polled response.
    resumed = list(two.responses.retrieve(response_id, stream=True, starting_after=cut - 1))
    assert [e.to_dict() for e in resumed] == [orjson.loads(e["data"]) for e in events[cut:]]
    assert resumed[-1].response.model_dump() == done.model_dump()  # type: ignore[union-attr]
    return done


def test_a_stream_cut_on_one_replica_resumes_on_the_other_byte_for_byte(fleet: Fleet) -> None:
    done = _cut_and_resume(fleet, {**GREEDY, "input": "Hi there"}, 5)
    assert (done.status, done.usage.output_tokens) == ("incomplete", 12)


def _cancel(fleet: Fleet, body: dict[str, Any]) -> None:
    """Cancel a running background response through the other replica: cancelled, its
    output so far kept, the same on a poll and on a second cancel."""
    one, two = _client(_base(fleet, 0)), _client(_base(fleet, 1))
    started = one.responses.create(**body, background=True)
    eventually(lambda: one.responses.retrieve(started.id).status == "in_progress",
               what="it runs", timeout=30)  # fmt: skip
    cancelled = two.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert 0 < cancelled.usage.output_tokens < body["max_output_tokens"]  # type: ignore[union-attr]
    assert cancelled.output[0].content[0].text  # type: ignore[union-attr]
    assert one.responses.retrieve(started.id).model_dump() == cancelled.model_dump()
    assert one.responses.cancel(started.id).model_dump() == cancelled.model_dump()


def test_cancel_on_the_other_replica_stops_it_and_repeats(fleet: Fleet) -> None:
    _cancel(fleet, {**LONG, "input": "Talk a long time."})
    one, two = _client(_base(fleet, 0)), _client(_base(fleet, 1))
    # A finished one is returned as it is; a foreground one cannot be cancelled.
    finished = _done(one, one.responses.create(**GREEDY, input="Hi", background=True).id)
    assert two.responses.cancel(finished.id).model_dump() == finished.model_dump()
    kept = one.responses.create(**GREEDY, input="Hi", store=True)
    with pytest.raises(openai.BadRequestError) as info:
        one.responses.cancel(kept.id)
    assert info.value.body["param"] == "response_id"  # type: ignore[index]


def test_it_outlives_the_edge_that_started_it(fleet: Fleet) -> None:
    third = fleet.add_edge()
    started = _client(third).responses.create(**{**LONG, "max_output_tokens": 300}, input="Go on.",
                                              background=True)  # fmt: skip
    fleet.edges.pop().kill()  # SIGKILL: no hand-over, its lease lapses
    done = _done(_client(_base(fleet, 0)), started.id)
    assert done.status == "incomplete"  # it ran to its max_output_tokens
    assert done.usage.output_tokens == 300  # type: ignore[union-attr]


def test_refusals_and_ownership(fleet: Fleet) -> None:
    one, bob = _client(_base(fleet, 0)), _client(_base(fleet, 1), "bob")
    for extra, param in [({"store": False}, "background"), ({"background": "yes"}, "background")]:
        body = {"background": True, **extra}
        with pytest.raises(openai.BadRequestError) as info:
            one.responses.create(**GREEDY, input="Hi", extra_body=body)
        assert info.value.body["param"] == param  # type: ignore[index]
    started = one.responses.create(**GREEDY, input="Hi", background=True)
    bad = [("stream=maybe", "stream"), ("stream=true&starting_after=x", "starting_after"),
           ("stream=true&starting_after=-1", "starting_after")]  # fmt: skip
    for query, param in bad:
        with pytest.raises(openai.BadRequestError) as info:
            one.get(f"/responses/{started.id}?{query}", cast_to=object)
        assert info.value.body["param"] == param  # type: ignore[index]
    kept = one.responses.create(**GREEDY, input="Hi", store=True)
    with pytest.raises(openai.BadRequestError) as info:
        one.get(f"/responses/{kept.id}?stream=true", cast_to=object)
    assert info.value.body["param"] == "stream"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(started.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.cancel(started.id)
    with pytest.raises(openai.NotFoundError):
        bob.get(f"/responses/{started.id}?stream=true", cast_to=object)
    with pytest.raises(openai.NotFoundError):
        one.responses.cancel("resp_nothing")


@pytest.mark.model
def test_the_real_model_in_the_background(model_fleet: Fleet) -> None:
    """SmolLM2 on vLLM: a background stream cut and resumed on the other replica byte
    for byte, polled there as the same request answers in the foreground; cancelled."""
    body = {"model": "", "temperature": 0, "max_output_tokens": 16,
            "input": "Name three rivers of Europe."}  # fmt: skip
    done = _cut_and_resume(model_fleet, body, 6)
    plain = _client(_base(model_fleet, 0)).responses.create(**body)
    assert (done.status, done.output_text) == (plain.status, plain.output_text)
    assert done.usage.model_dump() == plain.usage.model_dump()  # type: ignore[union-attr]
    _cancel(model_fleet, {**LONG, "max_output_tokens": 400, "input": "Tell me a story."})
