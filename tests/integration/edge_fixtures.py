"""Helpers for the edge's integration tests: a real sim worker plus a real uvicorn edge,
direct gRPC calls to compare against, and a small independent SSE reader.

Not fixtures themselves (each test module builds its own, with the worker flags it needs),
so no conftest is shared with other suites.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import orjson

from edge.stream.ids import ResumeCodec
from generated import sluice_pb2 as pb
from generated import sluice_pb2_grpc as pb_grpc
from tests.procs import Proc, start_edge, start_worker
from tests.waits import eventually

# Edges started by tests share this resume secret, so tests can check event ids.
RESUME_SECRET = "integration-test-resume-secret"
EDGE_ENV = {"SLUICE_RESUME_SECRET": RESUME_SECRET}
CODEC = ResumeCodec(hashlib.sha256(RESUME_SECRET.encode()).digest())


@dataclass
class Stack:
    """A worker and an edge in front of it."""

    worker: Proc
    edge: Proc

    @property
    def base(self) -> str:
        return f"http://{self.edge.address}"


def wait_ready(base: str, timeout: float = 15.0) -> None:
    """Until the edge's /readyz says a worker is SERVING."""
    eventually(
        lambda: httpx.get(f"{base}/readyz", timeout=1).status_code == 200,
        what=f"the edge at {base} is ready",
        timeout=timeout,
        ignore=(httpx.HTTPError,),
    )


@contextmanager
def stack(
    worker_args: tuple[str, ...] = (),
    edge_args: tuple[str, ...] = (),
    edge_env: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """Start a sim worker and an edge for it; end both by PID afterwards."""
    worker = start_worker("--engine", "sim", *worker_args)
    try:
        env = {**EDGE_ENV, **(edge_env or {})}
        edge = start_edge("--worker", worker.address, *edge_args, env=env)
        try:
            wait_ready(f"http://{edge.address}")
            yield Stack(worker, edge)
        finally:
            edge.kill()
    finally:
        worker.kill()


# -- direct gRPC to the worker (the reference the edge is compared with) ---------------


def chat_start(messages: list[dict[str, str]], **sampling: Any) -> pb.StartGeneration:
    start = pb.StartGeneration(sampling=pb.SamplingParams(**sampling))
    start.chat.messages.extend(
        pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages
    )
    return start


def direct_generate(address: str, start: pb.StartGeneration) -> tuple[str, pb.Final]:
    """The worker's own text and final message for `start`, over plain gRPC."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationStub(channel)
        text = []
        for msg in stub.Generate(iter([pb.GenerateRequest(start=start)]), timeout=60):
            if msg.HasField("final"):
                return "".join(text), msg.final
            text.append(msg.chunk.text)
    raise AssertionError("no final message")


def worker_stats(address: str) -> pb.WorkerStats:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.GenerationStub(channel).GetStats(pb.GetStatsRequest(), timeout=5)


def list_models(address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        resp = pb_grpc.GenerationStub(channel).ListModels(pb.ListModelsRequest(), timeout=5)
    return [m.id for m in resp.models]


# -- SSE over HTTP --------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[dict[str, str]]:
    """An independent SSE parser (WHATWG rules, LF-terminated lines as the edge writes).

    One dict per dispatched event (keys: data, and id/event/retry when present) and one
    {"comment": ...} per comment line.
    """
    out: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    data: list[str] | None = None
    for line in raw.decode().split("\n"):
        if not line:
            if data is not None:
                out.append({**fields, "data": "\n".join(data)})
            fields, data = {}, None
        elif line.startswith(":"):
            out.append({"comment": line[1:].strip()})
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data = [*(data or []), value]
            else:
                fields[name] = value
    return out


def stream_raw(
    base: str, path: str, body: dict[str, Any], **kw: Any
) -> tuple[httpx.Response, bytes]:
    """POST and read the whole streamed body."""
    with httpx.stream("POST", f"{base}{path}", json=body, timeout=60, **kw) as resp:
        raw = b"".join(resp.iter_bytes())
    return resp, raw


def data_events(events: list[dict[str, str]]) -> list[dict[str, str]]:
    return [e for e in events if "data" in e]


def chunks(events: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The JSON chunks of a good stream (everything before [DONE])."""
    datas = [e["data"] for e in data_events(events)]
    assert datas and datas[-1] == "[DONE]", datas[-3:]
    return [orjson.loads(d) for d in datas[:-1]]


def chat_text(chunk_list: list[dict[str, Any]]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunk_list if c["choices"]
    )


def streamed_tool_calls(stream: Any) -> tuple[list[dict[str, Any]], str | None]:
    """Tool calls reassembled from an SDK chat stream's deltas (choice 0), and its finish
    reason: [{"id", "name", "arguments"}] by call index."""
    calls: dict[int, dict[str, Any]] = {}
    reason = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
            reason = choice.finish_reason or reason
    return [calls[i] for i in sorted(calls)], reason


def raw_request(
    base_addr: tuple[str, int], path: str, body: dict[str, Any], rcvbuf: int = 0
) -> socket.socket:
    """Send an HTTP/1.1 POST on a raw socket and return it unread (for disconnects and
    slow readers); `rcvbuf` shrinks the socket's receive buffer first."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(base_addr)
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {base_addr[0]}:{base_addr[1]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def read_until(sock: socket.socket, marker: bytes, limit: float = 10.0, count: int = 1) -> bytes:
    """Read from a raw socket until `marker` has appeared `count` times."""
    buf = b""
    sock.settimeout(limit)
    while buf.count(marker) < count:
        part = sock.recv(65536)
        if not part:
            break
        buf += part
    return buf


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def metric(base: str, name: str, labels: str = "") -> float:
    """One sample from the edge's /metrics (0 when absent)."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def read_to_end(sock: socket.socket, limit: float = 30.0) -> bytes:
    """Read a chunked HTTP/1.1 response from a raw socket until its last chunk."""
    sock.settimeout(limit)
    out = b""
    while part := sock.recv(1 << 20):
        out += part
        if out.endswith(b"0\r\n\r\n"):
            break
    return out


def dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response (status line and headers dropped)."""
    body = raw.split(b"\r\n\r\n", 1)[1]
    out = bytearray()
    pos = 0
    while True:
        end = body.index(b"\r\n", pos)
        size = int(body[pos:end], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2
