"""The `Session` contract against a real worker (sim engine), and the edge over sessions
through a real network fault: acceptance and refusal in-band, cancel, detach then resume,
a stalled generation beside 63 fast ones on one session, a session cut while its worker
lives (every stream completes exactly, by index)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import httpx
import pytest

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.integration.edge_fixtures import EDGE_ENV, chunks, parse_sse, wait_ready
from tests.procs import start_edge, start_worker
from tests.tcp_proxy import TcpProxy

SP = pb.SamplingParams
STATUS_INVALID_ARGUMENT = 3
STATUS_RESOURCE_EXHAUSTED = 8


@pytest.fixture(scope="module")
def worker():
    w = start_worker(
        "--engine", "sim", "--max-num-seqs", "96", "--max-waiting", "4",
        "--sim-ttft", "0.01", "--sim-token-delay", "0.005", "--sim-answer-tokens", "40",
    )  # fmt: skip
    yield w
    w.kill()


def start(rid: str, prompt: str = "Tell me about rivers", **kw: object) -> pb.StartGeneration:
    sampling = SP(temperature=0, **{k: v for k, v in kw.items() if k != "detach_grace_ms"})
    s = pb.StartGeneration(request_id=rid, prompt=prompt, sampling=sampling)
    if "detach_grace_ms" in kw:
        s.detach_grace_ms = kw["detach_grace_ms"]  # type: ignore[assignment]
    return s


def act(**kw: object) -> pb.SessionAction:
    return pb.SessionAction(**kw)  # type: ignore[arg-type]


async def simple(address: str, s: pb.StartGeneration) -> list[pb.GenerateResponse]:
    """The same generation in simple mode: the reference."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = pb_grpc.GenerationStub(ch).Generate(iter([pb.GenerateRequest(start=s)]))
        return [m async for m in call]


def normalized(msgs: list[pb.GenerateResponse]) -> list[tuple[object, ...]]:
    """(index, kind, text, token ids, reason) per message: what must match exactly."""
    out: list[tuple[object, ...]] = []
    for m in msgs:
        if m.WhichOneof("kind") == "chunk":
            out.append((m.index, "chunk", m.chunk.text, tuple(m.chunk.token_ids)))
        else:
            out.append((m.index, "final", m.final.reason, m.final.usage.completion_tokens))
    return out


def joined(msgs: list[pb.GenerateResponse]) -> tuple[str, tuple[int, ...], object]:
    """Text, token ids and reason: the same however the tokens were split into chunks."""
    text = "".join(m.chunk.text for m in msgs if m.WhichOneof("kind") == "chunk")
    ids = tuple(i for m in msgs if m.WhichOneof("kind") == "chunk" for i in m.chunk.token_ids)
    return text, ids, msgs[-1].final.reason


class RawSession:
    """A Session RPC driven by hand: frames as they come, entries grouped by generation."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = pb_grpc.GenerationStub(channel).Session()
        self.entries: dict[str, list[pb.GenerateResponse]] = defaultdict(list)
        self.accepted: list[str] = []
        self.order: list[tuple[str, str]] = []  # ("accepted" | "entry", request id)
        self.frames = 0

    async def send(self, *actions: pb.SessionAction) -> None:
        await self.call.write(pb.SessionRequest(actions=list(actions)))

    async def read_until(self, done, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                frame = await self.call.read()
                assert frame is not grpc.aio.EOF
                self.frames += 1
                for rid in frame.accepted:
                    self.accepted.append(rid)
                    self.order.append(("accepted", rid))
                for m in frame.entries:
                    self.entries[m.request_id].append(m)
                    self.order.append(("entry", m.request_id))

    def ended(self, *rids: str):
        def check() -> bool:
            return all(
                self.entries[r] and self.entries[r][-1].WhichOneof("kind") == "final" for r in rids
            )

        return check


async def test_generations_are_accepted_before_their_messages_and_match_simple_mode(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        starts = [start(f"a{i}", prompt=f"Tell me about rivers {i}") for i in range(4)]
        await s.send(*(act(start=x) for x in starts))
        await s.read_until(s.ended(*(x.request_id for x in starts)))
        for x in starts:
            rid = x.request_id
            assert s.order.index(("accepted", rid)) < s.order.index(("entry", rid))
            ref = await simple(worker.address, x)
            got = s.entries[rid]
            assert [m.index for m in got] == list(range(len(got)))  # gapless, from 0
            assert joined(got) == joined(ref)
        # one frame carries many generations' messages: far fewer frames than messages
        assert s.frames < sum(len(v) for v in s.entries.values())
        s.call.cancel()


async def test_a_refusal_is_in_band_with_status_and_field_and_leaves_the_others(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        await s.send(act(start=start("bad", top_p=2.0)), act(start=start("good")))
        await s.read_until(s.ended("bad", "good"))
        assert "bad" not in s.accepted and "good" in s.accepted
        [final] = s.entries["bad"]
        assert final.index == 0 and final.final.reason == pb.FINISH_REASON_ERROR
        assert final.final.error.code == STATUS_INVALID_ARGUMENT
        assert final.final.error.field == "sampling.top_p"
        assert s.entries["good"][-1].final.reason in (
            pb.FINISH_REASON_STOP,
            pb.FINISH_REASON_LENGTH,
        )
        s.call.cancel()


async def test_overload_refusals_carry_a_retry_hint(worker):
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        long = {"max_tokens": 1500, "min_tokens": 1500}
        rids = [f"o{i}" for i in range(110)]  # 96 slots + 4 waiting
        await s.send(*(act(start=start(r, **long)) for r in rids))
        refused = lambda: [r for r in rids if s.entries[r] and r not in s.accepted]  # noqa: E731
        # 96 run (accepted), 4 wait for a slot (neither yet), 10 are refused at once
        await s.read_until(lambda: len(s.accepted) == 96 and len(refused()) == 10)
        for r in refused():
            [final] = s.entries[r]
            assert final.final.error.code == STATUS_RESOURCE_EXHAUSTED
            assert final.final.error.retry_after_ms > 0
        live = [r for r in rids if r not in refused()]
        await s.send(*(act(cancel=pb.CancelGeneration(request_id=r)) for r in live))
        await s.read_until(s.ended(*live))
        assert {s.entries[r][-1].final.reason for r in live} == {pb.FINISH_REASON_CANCELLED}
        s.call.cancel()


async def test_detach_then_resume_gives_the_rest_exactly(worker):
    x = start("d1", max_tokens=200, min_tokens=200, detach_grace_ms=10_000)
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        await s.send(act(start=x))
        await s.read_until(lambda: len(s.entries["d1"]) >= 3)
        await s.send(act(detach=pb.DetachGeneration(request_id="d1")))
        head = list(s.entries["d1"])
        s.call.cancel()
        stub = pb_grpc.GenerationStub(ch)
        resumed = stub.Resume(pb.ResumeRequest(request_id="d1", from_index=len(head)))
        tail = [m async for m in resumed]
    assert [m.index for m in head + tail] == list(range(len(head) + len(tail)))
    assert joined(head + tail) == joined(await simple(worker.address, start("ref", **{
        "max_tokens": 200, "min_tokens": 200})))  # fmt: skip


async def test_a_stalled_generation_never_holds_back_63_fast_ones(worker):
    window = 2048
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        long = {"max_tokens": 120, "min_tokens": 120}
        rids = [f"f{i}" for i in range(64)]
        await s.send(
            act(options=pb.SessionOptions(window_bytes=window)),
            *(act(start=start(r, prompt=f"river {r}", **long)) for r in rids),
        )
        consumed: dict[str, int] = defaultdict(int)

        async def ack_all_but_stalled() -> None:
            acks = []
            for r in rids[1:]:
                size = sum(m.ByteSize() for m in s.entries[r])
                if size > consumed[r]:
                    consumed[r] = size
                    acks.append(act(ack=pb.AckGeneration(request_id=r, bytes=size)))
            if acks:
                await s.send(*acks)

        fast_done = s.ended(*rids[1:])
        while not fast_done():
            await s.read_until(lambda n=s.frames: s.frames > n)
            await ack_all_but_stalled()
        stalled = s.entries[rids[0]]
        sent = sum(m.ByteSize() for m in stalled)
        assert sent >= window  # it ran into its window...
        assert sent < window + 1024  # ...and no further, while 63 others finished
        assert not stalled or stalled[-1].WhichOneof("kind") == "chunk"
        # it drains once its client reads again, gapless and exact
        while not s.ended(rids[0])():
            size = sum(m.ByteSize() for m in s.entries[rids[0]])
            await s.send(act(ack=pb.AckGeneration(request_id=rids[0], bytes=size)))
            await s.read_until(lambda n=s.frames: s.frames > n)
        got = s.entries[rids[0]]
        assert [m.index for m in got] == list(range(len(got)))
        ref = await simple(worker.address, start("ref", prompt=f"river {rids[0]}", **long))
        assert joined(got) == joined(ref)
        s.call.cancel()


def test_a_session_cut_while_the_worker_lives_loses_and_repeats_nothing(worker):
    proxy = TcpProxy("127.0.0.1", int(worker.address.rsplit(":", 1)[1]))
    edge = start_edge("--worker", proxy.address, "--sessions-per-worker", "1", env=EDGE_ENV)
    try:
        base = f"http://{edge.address}"
        wait_ready(base)
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "Tell me about rivers"}],
            "max_tokens": 150,
            "min_tokens": 150,
            "temperature": 0,
            "stream": True,
        }
        reference = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).content
        want = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks(parse_sse(reference))
        )
        with httpx.Client(base_url=base, timeout=30) as client:
            streams = [client.stream("POST", "/v1/chat/completions", json=body) for _ in range(6)]
            responses = [st.__enter__() for st in streams]
            heads = [r.iter_bytes() for r in responses]
            got = [next(h) for h in heads]  # every stream under way
            connections = proxy.connections
            assert proxy.cut() > 0
            got = [g + b"".join(h) for g, h in zip(got, heads, strict=True)]
            for st in streams:
                st.__exit__(None, None, None)
        assert proxy.connections > connections  # the session was reopened
        for raw in got:
            events = parse_sse(raw)
            assert not [e for e in events if e.get("event") == "error"]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks(events))
            assert text == want
    finally:
        edge.kill()
        proxy.close()


async def test_odd_actions_get_in_band_answers_and_the_session_serves_on(worker):
    """An empty action, unknown and past-the-end attaches, a live id started twice, a
    1-byte window and an ack beyond what was sent: each answered (or harmless), and the
    session's normal generation beside them completes exactly."""
    async with grpc.aio.insecure_channel(worker.address) as ch:
        s = RawSession(ch)
        await s.send(
            act(options=pb.SessionOptions(window_bytes=1)),
            pb.SessionAction(),
            act(attach=pb.AttachGeneration(request_id="nobody", from_index=0)),
            act(start=start("twice", max_tokens=30)),
            act(start=start("twice", max_tokens=30)),
            act(ack=pb.AckGeneration(request_id="twice", bytes=2**64 - 1)),
        )
        served = lambda: [  # noqa: E731
            m for m in s.entries["twice"] if m.HasField("final") and not m.final.HasField("error")
        ]
        await s.read_until(lambda: len(s.entries["nobody"]) == 1 and served())
        [missing] = s.entries["nobody"]
        assert missing.final.error.code == grpc.StatusCode.NOT_FOUND.value[0]
        assert missing.final.error.field == "request_id"
        errors = [m for m in s.entries["twice"] if m.final.HasField("error")]
        assert [e.final.error.code for e in errors] == [grpc.StatusCode.ALREADY_EXISTS.value[0]]
        good = [m for m in s.entries["twice"] if not m.final.HasField("error")]
        assert [m.index for m in good] == list(range(len(good)))
        assert joined(good) == joined(await simple(worker.address, start("ref", max_tokens=30)))
        past = good[-1].index + 5
        await s.send(act(attach=pb.AttachGeneration(request_id="twice", from_index=past)))
        await s.read_until(lambda: s.entries["twice"][-1].index == past)
        assert s.entries["twice"][-1].final.error.code == grpc.StatusCode.OUT_OF_RANGE.value[0]
        s.call.cancel()
