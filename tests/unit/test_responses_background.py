"""Background Responses' pure parts: the request's `background` (implies `store`, refused
with `store: false`), a response that stopped (`cancelled`, `failed`) or stands
(`snapshot`), and `BackgroundRuns` (leases held while a run runs, let go at shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from edge.api.responses import ResponsesFormat, parse_responses
from edge.api.runs import BackgroundRuns, lease_key
from edge.errors import ApiError
from edge.store.memory import MemoryStore
from generated import sluice_pb2 as pb

BODY: dict[str, Any] = {"model": "m", "input": "Hi"}


def test_background_implies_store_and_is_echoed() -> None:
    echo = parse_responses({**BODY, "background": True}).echo
    assert (echo["store"], echo["background"]) == (True, True)
    assert "background" not in parse_responses({**BODY, "background": False}).echo


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"background": True, "store": False}, "background can only be used when `store` is true"),
        ({"background": "yes"}, "'background' must be a boolean"),
    ],
)
def test_background_refusals_name_it(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_responses({**BODY, **extra})
    assert (info.value.status, info.value.param, info.value.message) == (400, "background", message)


def _fmt() -> ResponsesFormat:
    fmt = ResponsesFormat("abc", "m", 1, {"background": True})
    fmt.collect(pb.TokenChunk(text="Once upon"), None)
    return fmt


def test_a_snapshot_holds_the_output_so_far() -> None:
    snap = _fmt().snapshot("in_progress")
    assert (snap["status"], snap["usage"], snap["background"]) == ("in_progress", None, True)
    [item] = snap["output"]
    assert (item["status"], item["content"][0]["text"]) == ("in_progress", "Once upon")


def test_a_cancelled_response_keeps_its_output_and_usage() -> None:
    final = pb.Final(
        reason=pb.FINISH_REASON_CANCELLED, usage=pb.Usage(prompt_tokens=3, completion_tokens=2)
    )
    done = _fmt().stopped("cancelled", final)
    assert (done["status"], done["error"]) == ("cancelled", None)
    assert [(i["status"], i["content"][0]["text"]) for i in done["output"]] == [
        ("incomplete", "Once upon")
    ]
    assert (done["usage"]["input_tokens"], done["usage"]["output_tokens"]) == (3, 2)
    failed = _fmt().stopped("failed", None, {"code": "stream_expired", "message": "gone"})
    assert (failed["status"], failed["usage"], failed["error"]["code"]) == (
        "failed",
        None,
        "stream_expired",
    )


def test_runs_hold_their_lease_and_let_it_go_at_close() -> None:
    async def run() -> None:
        store = MemoryStore(60, 10)
        runs = BackgroundRuns()
        released: list[str] = []
        forever = asyncio.Event()
        assert runs.start("k", forever.wait(), store, lambda: released.append("k"))
        assert runs.running("k") and len(runs) == 1
        again = forever.wait()
        assert not runs.start("k", again, store)  # followed here already: closed unstarted
        assert again.cr_frame is None
        await asyncio.sleep(0)  # the renewer's first round
        assert await store.get_doc(lease_key("k")) == "1"
        await runs.close(store)
        assert (released, runs.running("k")) == (["k"], False)
        assert await store.get_doc(lease_key("k")) is None

    asyncio.run(run())
