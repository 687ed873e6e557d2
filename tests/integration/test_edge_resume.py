"""Streams that survive disconnects: cut after k events, resume with Last-Event-ID, and
the text equals an uninterrupted run byte for byte, with no event twice and none missing.

Real processes: a sim worker and an edge (and, for the replica test, a second edge).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.edge_fixtures import CODEC, EDGE_ENV, Stack, stack, wait_ready, worker_stats
from tests.procs import start_edge
from tests.waits import eventually

MESSAGES = [{"role": "user", "content": "Tell me about rivers and the sea."}]
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 1.0, "seed": 7}


@pytest.fixture(scope="module")
def sim() -> Iterator[Stack]:
    # ~50-token answers at 10 ms a token; the worker keeps a dropped generation for 5 s.
    with stack(
        ("--sim-token-delay", "0.01", "--sim-answer-tokens", "50", "--default-detach-grace", "5"),
        ("--openai-detach-grace", "5", "--retry-ms", "200"),
    ) as s:
        yield s


def body(sampling: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"messages": MESSAGES, "max_tokens": 40, "stream": True, **sampling, **extra}


def read_events(
    method: str,
    url: str,
    *,
    json: Any = None,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> tuple[int, list[dict[str, str]]]:
    """Data events of an SSE response; stop (dropping the connection) after `limit`."""
    events: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    with httpx.stream(method, url, json=json, headers=headers, timeout=30) as resp:
        if resp.status_code != 200 or limit == 0:
            return resp.status_code, events
        for line in resp.iter_lines():
            if not line:
                if "data" in fields:
                    events.append(fields)
                    if limit is not None and len(events) >= limit:
                        break
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
    return resp.status_code, events


def text_of(events: list[dict[str, str]]) -> str:
    out = []
    for e in events:
        if e["data"] != "[DONE]" and e.get("event") != "error":
            chunk = orjson.loads(e["data"])
            if chunk["choices"]:
                out.append(chunk["choices"][0]["delta"].get("content") or "")
    return "".join(out)


def assert_whole(parts: list[dict[str, str]], reference: list[dict[str, str]]) -> None:
    ids = [e["id"] for e in parts]
    assert len(set(ids)) == len(ids), "an event arrived twice"
    assert [CODEC.parse(i).seq for i in ids] == list(range(len(ids))), "an event is missing"
    assert parts[-1]["data"] == "[DONE]"
    assert text_of(parts) == text_of(reference)
    assert text_of(reference)


def chat_url(s: Stack) -> str:
    return f"{s.base}/v1/chat/completions"


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("k", [1, 2, 7, 20, -2, -1])  # -2: after finish, -1: before [DONE]
def test_openai_stream_resumes_exactly_after_k_events(sim: Stack, sampling, k) -> None:
    status, reference = read_events("POST", chat_url(sim), json=body(sampling))
    assert status == 200
    cut = k if k > 0 else len(reference) + k
    _, head = read_events("POST", chat_url(sim), json=body(sampling), limit=cut)
    assert len(head) == cut
    status, tail = read_events(
        "POST", chat_url(sim), json=body(sampling), headers={"Last-Event-ID": head[-1]["id"]}
    )
    assert status == 200
    assert_whole(head + tail, reference)


def test_resume_after_the_end_replays_the_tail(sim: Stack) -> None:
    _, reference = read_events("POST", chat_url(sim), json=body(GREEDY))
    finished = worker_stats(sim.worker.address).finished_total  # the reference's included
    _, head = read_events("POST", chat_url(sim), json=body(GREEDY), limit=3)

    def ended() -> bool:
        stats = worker_stats(sim.worker.address)
        return stats.finished_total > finished and stats.running + stats.waiting == 0

    # The dropped generation runs on to its end (its detach grace): resume only once it
    # ended, so the tail comes from the finished log, never by following it live.
    eventually(ended, what="the dropped generation ended on the worker")
    _, tail = read_events(
        "POST", chat_url(sim), json=body(GREEDY), headers={"Last-Event-ID": head[-1]["id"]}
    )
    assert_whole(head + tail, reference)


def test_resume_after_done_is_204(sim: Stack) -> None:
    _, events = read_events("POST", chat_url(sim), json=body(GREEDY))
    status, tail = read_events(
        "POST", chat_url(sim), json=body(GREEDY), headers={"Last-Event-ID": events[-1]["id"]}
    )
    assert (status, tail) == (204, [])


def test_readyz_is_public_and_shows_no_worker_address(sim: Stack) -> None:
    resp = httpx.get(f"{sim.base}/readyz")
    assert resp.status_code == 200 and resp.json()["workers"]
    assert sim.worker.address not in resp.text and str(sim.worker.port) not in resp.text


def test_forged_event_id_is_refused(sim: Stack) -> None:
    _, head = read_events("POST", chat_url(sim), json=body(GREEDY), limit=3)
    token, seq, cursor = head[-1]["id"].split(".")
    for forged in (
        f"{token[:2]}{'A' * 12}{token[14:]}.{seq}.{cursor}",  # another signature
        f"{token[:-4]}AAAA.{seq}.{cursor}",  # someone else's request id
        "not-an-id",
    ):
        resp = httpx.post(chat_url(sim), json=body(GREEDY), headers={"Last-Event-ID": forged})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "invalid_last_event_id"


def test_browser_stream_link_resumes_and_any_replica_can_serve_it(sim: Stack) -> None:
    """POST /v1/streams, GET the link (EventSource's way), drop, and resume through a
    second edge replica that shares only the secret: edges hold no stream state."""
    created = httpx.post(f"{sim.base}/v1/streams", json=body(SEEDED))
    assert created.status_code == 201, created.text
    link = created.json()["stream_url"]
    status, reference = read_events("GET", f"{sim.base}{link}")
    assert status == 200
    # The same link read again from the start gives the same events.
    _, head = read_events("GET", f"{sim.base}{link}", limit=6)
    replica = start_edge("--worker", sim.worker.address, env=EDGE_ENV)
    try:
        wait_ready(f"http://{replica.address}")
        _, tail = read_events(
            "GET", f"http://{replica.address}{link}", headers={"Last-Event-ID": head[-1]["id"]}
        )
    finally:
        replica.kill()
    assert_whole(head + tail, reference)
    # The query-parameter form (for clients that cannot set headers) works the same.
    _, tail2 = read_events("GET", f"{sim.base}{link}?last_event_id={head[-1]['id']}")
    assert text_of(head + tail2) == text_of(reference)


def test_stream_link_before_any_event_and_refusals(sim: Stack) -> None:
    created = httpx.post(f"{sim.base}/v1/streams", json=body(GREEDY)).json()
    link = f"{sim.base}{created['stream_url']}"
    read_events("GET", link, limit=0)  # connect, read nothing, drop
    _, events = read_events("GET", link)
    _, reference = read_events("POST", chat_url(sim), json=body(GREEDY))
    assert text_of(events) == text_of(reference) and events[-1]["data"] == "[DONE]"
    assert httpx.get(link[:-3] + "AAA").status_code == 404  # forged link
    other = httpx.post(f"{sim.base}/v1/streams", json=body(GREEDY)).json()["stream_url"]
    resp = httpx.get(f"{sim.base}{other}", headers={"Last-Event-ID": events[3]["id"]})
    assert resp.status_code == 400  # an id from another stream
    bad = httpx.post(f"{sim.base}/v1/streams", json={**body(GREEDY), "top_p": 5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"


def test_resume_after_the_log_expired_is_410() -> None:
    with stack(
        ("--sim-token-delay", "0", "--default-detach-grace", "0", "--replay-retention", "0.3"),
        ("--retry-ms", "200"),
    ) as s:
        _, events = read_events("POST", chat_url(s), json=body(GREEDY), limit=3)
        eventually(
            lambda: worker_stats(s.worker.address).replay_generations == 0,
            what="the generation ended and its replay log expired (0.3 s retention)",
        )
        resp = httpx.post(
            chat_url(s), json=body(GREEDY), headers={"Last-Event-ID": events[-1]["id"]}
        )
        assert resp.status_code == 410
        assert resp.json()["error"]["code"] == "stream_expired"
