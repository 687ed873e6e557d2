"""No `StartGeneration` gets INTERNAL or UNKNOWN from the worker, or takes it down (issue
28, for gRPC callers: internal services, grpcurl): a hypothesis property over every
field of the message, nested messages included, filled from its descriptor with what a
careless or hostile caller sends (integer extremes, NaN and infinities, unknown enum
numbers, long and odd strings, JSON that is no JSON). Every answer is a generation that
ends with its final message, or a status with a message, in simple mode and on one
session (which outlives them all); the worker is a real sim worker (its intake,
templates, constraints and admission are the vLLM worker's)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from model_service.client import ClientSession, GenerationError, SluiceClient
from tests.procs import Proc, start_worker

REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # its own timeout_ms
}
T = FieldDescriptor
INTS = {
    T.TYPE_INT32: (-(2**31), 2**31 - 1),
    T.TYPE_SINT32: (-(2**31), 2**31 - 1),
    T.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    T.TYPE_INT64: (-(2**63), 2**63 - 1),
    T.TYPE_SINT64: (-(2**63), 2**63 - 1),
    T.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    T.TYPE_UINT32: (0, 2**32 - 1),
    T.TYPE_FIXED32: (0, 2**32 - 1),
    T.TYPE_UINT64: (0, 2**64 - 1),
    T.TYPE_FIXED64: (0, 2**64 - 1),
}
JSONISH = ["{", "[]", "{}", '{"type": "object", "properties": {"a": {"$ref": "#"}}}', "null",
           '{"enum": []}', "(", "a{0,100000}", "root ::= root", '"', "\\", "[" * 3000]  # fmt: skip
texts = st.one_of(
    st.text(max_size=30),
    st.sampled_from(JSONISH),
    st.sampled_from(["", " ", "user", "assistant", "system", "tool", "\x00", "\u2028"]),
    st.integers(min_value=1_000, max_value=100_000).map(lambda n: "x" * n),
)


def hostile_settings(examples: int) -> Any:
    """Hypothesis's settings for these properties: fixed draws, no deadline (a request
    may wait on the engine), big messages allowed."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in INTS:
        lo, hi = INTS[field.type]
        return st.one_of(st.sampled_from([lo, hi, 0, 1, -1 if lo < 0 else 2]),
                         st.integers(min_value=lo, max_value=hi))  # fmt: skip
    if field.type in (T.TYPE_FLOAT, T.TYPE_DOUBLE):
        return st.one_of(st.floats(width=32 if field.type == T.TYPE_FLOAT else 64),
                         st.sampled_from([0.0, -1.0, 1e30, -1e30]))  # fmt: skip
    if field.type == T.TYPE_BOOL:
        return st.booleans()
    if field.type == T.TYPE_STRING:
        return texts
    if field.type == T.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == T.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(min_value=-5, max_value=99))
    raise AssertionError(field.type)


@st.composite
def message(draw: st.DrawFn, desc: Descriptor, depth: int = 0) -> Any:
    """A message of type `desc` with some of its fields set (recursing into messages)."""
    msg = pb.__dict__.get(desc.name) if desc.containing_type is None else None
    out = (msg or _class_of(desc))()
    fields = [f.name for f in desc.fields]
    names = draw(st.sets(st.sampled_from(fields), max_size=6)) if fields else set()
    for field in desc.fields:
        if field.name not in names:
            continue
        repeated = field.is_repeated
        if field.type == T.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                key_s = scalar(field.message_type.fields_by_name["key"])
                value_f = field.message_type.fields_by_name["value"]
                if value_f.type == T.TYPE_MESSAGE:
                    continue
                entries = draw(st.dictionaries(key_s, scalar(value_f), max_size=3))
                getattr(out, field.name).update(entries)
            elif depth < 4:
                children = draw(st.lists(message(field.message_type, depth + 1),
                                         min_size=1, max_size=3 if repeated else 1))  # fmt: skip
                if repeated:
                    getattr(out, field.name).extend(children)
                else:
                    getattr(out, field.name).CopyFrom(children[0])
            continue
        if repeated:
            getattr(out, field.name).extend(draw(st.lists(scalar(field), max_size=4)))
        else:
            setattr(out, field.name, draw(scalar(field)))
    return out


def _class_of(desc: Descriptor) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


def usable(start: pb.StartGeneration) -> None:
    """Make the parts the worker checks first acceptable (the rest stays as drawn)."""
    start.ClearField("model")
    if len(start.request_id.encode()) > 128:
        start.ClearField("request_id")
    kind = start.WhichOneof("input")
    if kind is None or (kind == "prompt" and not start.prompt.strip()):
        start.prompt = "hello there"
    elif kind == "chat":
        if not start.chat.messages:
            start.chat.messages.add()
        for m in start.chat.messages:
            if m.role not in ("system", "user", "assistant", "tool"):
                m.role = "user"
    elif not start.prompt_tokens.ids or max(start.prompt_tokens.ids) >= 1000:
        start.prompt_tokens.ids[:] = [1, 2, 3]
    if start.sampling.HasField("max_tokens"):
        start.sampling.max_tokens = max(1, min(start.sampling.max_tokens, 64))


def answered_or_refused(
    stub: pb_grpc.GenerationStub, start: pb.StartGeneration, worker: Proc, timeout: float
) -> None:
    """One simple-mode generation of `start`: it ends with its final message, or a refusal
    in the worker's own words; the worker lives on."""
    try:
        got = list(stub.Generate(iter([pb.GenerateRequest(start=start)]), timeout=timeout))
        assert got and got[-1].HasField("final"), got[-1:]
    except grpc.RpcError as err:
        assert err.code() in REFUSALS, (err.code(), err.details(), start)
        # The worker's own message, not the transport's ("Stream removed": a status
        # message over the client's metadata limit).
        assert err.details() and "Stream removed" not in err.details(), start
    assert worker.proc.poll() is None, worker.log()[-3000:]


@pytest.fixture(scope="module")
def worker() -> Iterator[Proc]:
    proc = start_worker("--engine", "sim", "--sim-ttft", "0", "--sim-token-delay", "0",
                        "--max-model-len", "2048")  # fmt: skip
    try:
        yield proc
    finally:
        proc.kill()


def test_no_start_gets_internal_or_takes_the_worker_down(worker: Proc) -> None:
    with grpc.insecure_channel(worker.address) as channel:
        stub = pb_grpc.GenerationStub(channel)

        @hostile_settings(150)
        @given(start=message(pb.StartGeneration.DESCRIPTOR), keep=st.integers(0, 7))
        def one(start: pb.StartGeneration, keep: int) -> None:
            start.multiplexed = False  # one generation per call (sessions: test_sessions)
            if keep:  # mostly: past the first checks, so the deeper fields are reached
                usable(start)
            answered_or_refused(stub, start, worker, 30)

        one()


def test_no_start_breaks_a_session_or_gets_internal(worker: Proc) -> None:
    async def open_session() -> tuple[SluiceClient, ClientSession]:
        client = SluiceClient(worker.address)
        return client, client.session()

    loop = asyncio.new_event_loop()
    client, session = loop.run_until_complete(open_session())
    count = iter(range(10_000))

    async def run(start: pb.StartGeneration) -> None:
        gen = session.start(start)
        try:
            await asyncio.wait_for(gen.text(), 30)
        except GenerationError as err:
            assert err.code in REFUSALS and err.message, (err.code, err.message, start)
        assert gen.final is not None

    try:

        @hostile_settings(100)
        @given(start=message(pb.StartGeneration.DESCRIPTOR), keep=st.integers(0, 7))
        def one(start: pb.StartGeneration, keep: int) -> None:
            if keep:
                usable(start)
            start.multiplexed = False
            start.request_id = f"s{next(count)}"  # the session's key for its entries
            loop.run_until_complete(run(start))

        one()
        ok = pb.StartGeneration(request_id="last", prompt="hello there")
        ok.sampling.max_tokens = 3
        assert loop.run_until_complete(session.start(ok).text())  # the session served on
        assert worker.proc.poll() is None
    finally:
        loop.run_until_complete(session.close())
        loop.run_until_complete(client.close())
        loop.close()


# Every other method, with a request drawn the same way; a watch answers its first
# message (or nothing before the deadline: it only sends on change).
UNARY = {"Tokenize": pb.TokenizeRequest, "Embed": pb.EmbedRequest,
         "LoadAdapter": pb.LoadAdapterRequest, "UnloadAdapter": pb.UnloadAdapterRequest,
         "ListModels": pb.ListModelsRequest, "GetStats": pb.GetStatsRequest}  # fmt: skip
STREAMS = {"Resume": pb.ResumeRequest, "WatchLoad": pb.WatchLoadRequest,
           "WatchCache": pb.WatchCacheRequest}  # fmt: skip


@pytest.mark.parametrize("method", [*UNARY, *STREAMS, "Generate", "Session"])
def test_no_request_of_any_method_gets_internal(worker: Proc, method: str) -> None:
    kind = {**UNARY, **STREAMS, "Generate": pb.GenerateRequest, "Session": pb.SessionRequest}
    with grpc.insecure_channel(worker.address) as channel:
        call = getattr(pb_grpc.GenerationStub(channel), method)

        @hostile_settings(30)
        @given(request=message(kind[method].DESCRIPTOR))
        def one(request: Any) -> None:
            try:
                if method in UNARY:
                    call(request, timeout=10)
                elif method in STREAMS:
                    next(iter(call(request, timeout=1)), None)
                else:  # a client stream: this one message, then half-close
                    for _ in call(iter([request]), timeout=5):
                        pass
            except grpc.RpcError as err:
                assert err.code() in REFUSALS | {grpc.StatusCode.CANCELLED}, (
                    err.code(), err.details(), request,
                )  # fmt: skip
                assert err.details() and "Stream removed" not in err.details(), request
            assert worker.proc.poll() is None, worker.log()[-3000:]

        one()


def test_a_refusal_echoing_a_huge_value_still_reaches_the_caller(worker: Proc) -> None:
    """Found by the property (rarely drawn): a NOT_FOUND naming a 100 KB model name was
    over the client's metadata limit, which the caller saw as RESOURCE_EXHAUSTED."""
    start = pb.StartGeneration(model="x" * 100_000, prompt="hello there")
    with grpc.insecure_channel(worker.address) as channel:
        with pytest.raises(grpc.RpcError) as err:
            list(pb_grpc.GenerationStub(channel).Generate(iter([pb.GenerateRequest(start=start)])))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    details = err.value.details()
    assert details.startswith("model 'xxx") and len(details) <= 500, details[:100]
