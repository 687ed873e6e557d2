"""`Framer.text_event` (the per-stream template) against the general path it stands for:
`event(fmt.delta(text, None), cursor)`, byte for byte, whatever the text, the model name
(a `%` in it must stay literal), the origin (a continuation on another worker) or the
worker's time stamps (benchmarks)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edge.api.formats import make_format
from edge.stream.framing import Framer
from tests.unit.scripted import ScriptedCall, make_worker
from tests.unit.test_stream_response import CREATED, job


class _Call(ScriptedCall):
    """A call whose origin (request id, worker) the test moves, as a continuation does."""


texts = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(["chat", "completions"]),
    stamps=st.booleans(),
    model=st.sampled_from(["m", "50%-model", "%s%d", 'q"\\u0000']),
    events=st.lists(st.tuples(texts, st.booleans()), min_size=1, max_size=8),
)
def test_a_text_event_is_the_general_event_byte_for_byte(
    kind: str, stamps: bool, model: str, events: list[tuple[str, bool]]
) -> None:
    workers = [make_worker("127.0.0.1:1"), make_worker("127.0.0.1:2")]
    fast_call = _Call(workers[0], [], request_id="gen-1")
    slow_call = _Call(workers[0], [], request_id="gen-1")
    fast = Framer(
        job(fast_call, fmt=make_format(kind, "req1", model, CREATED, False), stamps=stamps)
    )
    slow = Framer(
        job(slow_call, fmt=make_format(kind, "req1", model, CREATED, False), stamps=stamps)
    )
    fmt = make_format(kind, "req1", model, CREATED, False)
    for i, (text, moved) in enumerate(events):
        if moved:  # a continuation: another generation on the other worker
            for call in (fast_call, slow_call):
                call.request_id = f"gen-1.c{i}"
                call.worker = workers[i % 2]
        stamp = 10**18 + i if stamps else 0
        got = fast.text_event(text, i + 1, stamp)
        data = fmt.delta(text, None)
        if stamps:  # the worker's clock as the chunk's last field, as the response adds it
            data = data[:-1] + b',"sluice_worker_time_ns":%d}' % stamp
        want = slow.event(data, i + 1)
        assert got == want
        assert fast.framed_id == slow.framed_id and fast.seq == slow.seq
