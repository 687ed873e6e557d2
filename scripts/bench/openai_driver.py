"""OpenAI-compatible streaming servers: our edge, vLLM's own server, anything that speaks
`POST /v1/chat/completions` or `/v1/completions` with `stream: true`.

Requests are written by hand (HTTP/1.1, keep-alive) and read with `sse_reader`. Events are
classified with byte searches; JSON is parsed only for the rare events that need it
(usage, errors, unusual formatting). Asks for `stream_options.include_usage` so token
counts come from the server; falls back to counting token-bearing events.

Multi-turn workloads need each answer's text (it becomes the next turn's history): with
`collect`, token events are parsed as JSON and their text kept. Usage's
`prompt_tokens_details.cached_tokens` and the `x-sluice-worker` response header (our
edge names the worker that served a request) are recorded when present.

Worker stamps: with `stamp`, requests carry `X-Sluice-Stamp-Times: 1`; an edge that honours
it puts `"sluice_worker_time_ns": N` (the worker's `worker_time_ns` of the first gRPC
message merged into the event) into each chunk's JSON, or an SSE comment line
`: sluice_worker_time_ns=N` in the event. Either form is read here.
"""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import urlsplit

import orjson

from scripts.bench import record as rec_mod
from scripts.bench.record import RequestRecord
from scripts.bench.sse_reader import ProtocolError, SSEClient
from scripts.bench.workload import RequestSpec, WorkloadConfig

STAMP_HEADER = "X-Sluice-Stamp-Times"
STAMP_KEY = b"sluice_worker_time_ns"
_STAMP_RE_ANY = re.compile(rb'sluice_worker_time_ns"?\s*[:=]\s*(\d+)')
_STAMP_RE = re.compile(rb'"?\s*[:=]\s*(\d+)')  # matched right after STAMP_KEY
_FINISH_RE = re.compile(rb'"finish_reason"\s*:\s*"(\w+)"')
DONE = b"data: [DONE]"
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def parse_url(url: str) -> tuple[str, int, str]:
    """host, port and path prefix of a base URL (`http://h:p` or `http://h:p/v1`)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme != "http":
        raise SystemExit(f"only http:// URLs are supported, not {url!r}")
    prefix = parts.path.rstrip("/")
    prefix = prefix.removesuffix("/v1")
    return parts.hostname or "127.0.0.1", parts.port or 80, prefix


class StreamSink:
    """Turns one response's SSE events into a RequestRecord (hot path: bytes only)."""

    __slots__ = ("collect", "done_seen", "error", "finish", "marker", "parts", "rec", "stamp",
                 "usage")  # fmt: skip

    def __init__(self, record: RequestRecord, api: str, stamp: bool, collect: bool = False) -> None:
        self.rec = record
        self.stamp = stamp
        self.collect = collect
        self.parts: list[str] = []
        self.marker = b'"content":"' if api == "chat" else b'"text":"'
        self.done_seen = False
        self.usage: dict[str, int] | None = None
        self.error = ""
        self.finish = ""

    def on_events(self, now_ns: int, events: list[bytes]) -> None:
        marker = self.marker
        empty = marker + b'"'
        rec = self.rec
        append = rec.event_ns.append
        stamp = self.stamp
        for ev in events:
            # Fast forms: `data: {...}`, or `id: ...` + `data: {...}` (resumable streams).
            if not ev.startswith(b"data: {") and not (
                ev.startswith(b"id:") and ev.count(b"\n") == 1 and b"\ndata: {" in ev
            ):
                ev = self._unusual(now_ns, ev)
                if not ev:
                    continue
            if marker in ev and empty not in ev:
                append(now_ns)
                if self.collect:
                    self._keep(ev)
                if stamp:
                    i = ev.find(STAMP_KEY)
                    if i >= 0:
                        self._stamp(now_ns, ev, i)
                if b'"finish_reason":"' in ev:
                    self._finish(ev)
            else:
                self._other(now_ns, ev)
        if not rec.first_ns and rec.event_ns:
            rec.first_ns = rec.event_ns[0]

    def _keep(self, ev: bytes) -> None:
        """The text of a token event (multi-turn: the answer is the next turn's history)."""
        try:
            obj = orjson.loads(ev[ev.find(b"data: ") + 6 :].split(b"\n", 1)[0])
        except orjson.JSONDecodeError:
            return
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if text:
                self.parts.append(text)

    def _stamp(self, now_ns: int, ev: bytes, at: int = -1) -> None:
        m = _STAMP_RE.match(ev, at + len(STAMP_KEY)) if at >= 0 else _STAMP_RE_ANY.search(ev)
        if m:
            self.rec.stamp_lat_ns.append(now_ns + rec_mod.WALL_OFFSET_NS - int(m.group(1)))
            self.rec.stamp_at_ns.append(now_ns)

    def _finish(self, ev: bytes) -> None:
        m = _FINISH_RE.search(ev)
        if m:
            self.finish = m.group(1).decode()

    def _unusual(self, now_ns: int, block: bytes) -> bytes:
        """Comments, `event:` lines, multi-line data, [DONE]: rare, so done slowly."""
        if block.startswith(DONE):
            self.done_seen = True
            return b""
        data: list[bytes] = []
        stamp = b""
        is_error = False
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
            elif line.startswith(b"event:") and b"error" in line:
                is_error = True
            elif line.startswith(b":") and STAMP_KEY in line:
                stamp = line
        if not data:
            return b""
        payload = b"\n".join(data)
        if payload == b"[DONE]":
            self.done_seen = True
            return b""
        if is_error:
            self.error = self.error or payload.decode(errors="replace")[:300]
            return b""
        # Re-serialize compactly so the byte tests of the hot path apply; a stamp from a
        # comment line rides along after a newline, where the stamp search finds it.
        try:
            compact = b"data: " + orjson.dumps(orjson.loads(payload))
            return compact + b"\n" + stamp if stamp else compact
        except orjson.JSONDecodeError:
            self.error = self.error or f"undecodable event: {payload[:100]!r}"
            return b""

    def _other(self, now_ns: int, ev: bytes) -> None:
        """Not a token: role chunk, finish chunk, usage chunk, error, or a spaced format."""
        if (
            b'"usage":{' not in ev
            and b'"error"' not in ev
            and b'": ' not in ev
            and b'"finish_reason":"' not in ev
        ):
            return  # role chunk or empty delta
        payload = ev[ev.find(b"data: ") + 6 :].split(b"\n", 1)[0]
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.error = self.error or f"undecodable event: {ev[:100]!r}"
            return
        if "error" in obj and "choices" not in obj:
            self.error = self.error or orjson.dumps(obj["error"]).decode()[:300]
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if text:  # a token event whose JSON had spaces: count it here
                self.rec.event_ns.append(now_ns)
                if self.collect:
                    self.parts.append(text)
                if not self.rec.first_ns:
                    self.rec.first_ns = now_ns
                if self.stamp and STAMP_KEY in ev:
                    self._stamp(now_ns, ev)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]


class OpenAIDriver:
    """Drives an OpenAI-compatible streaming endpoint over keep-alive HTTP/1.1."""

    def __init__(
        self,
        url: str,
        workload: WorkloadConfig,
        *,
        model: str = "",
        stamp: bool = False,
        api_key: str = "",
        timeout: float = 600.0,
        label: str = "sse",
        gzip: bool = False,
    ) -> None:
        self.host, self.port, prefix = parse_url(url)
        self.name = label
        self.path = prefix + PATHS[workload.api]
        self.models_path = prefix + "/v1/models"
        self.workload = workload
        self.model = model
        self.stamp = stamp
        self.timeout = timeout
        self.client = SSEClient(self.host, self.port)
        self.api_key = api_key
        headers = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host}:{self.port}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
        ]
        if api_key:
            headers.append(f"Authorization: Bearer {api_key}")
        if stamp:
            headers.append(f"{STAMP_HEADER}: 1")
        if gzip:  # a gzip body is decoded by the reader (`sse_reader`)
            headers.append("Accept-Encoding: gzip")
        self._head = ("\r\n".join(headers) + "\r\nContent-Length: ").encode()
        self._collect = workload.kind == "multiturn"

    async def setup(self) -> None:
        """Find the served model's name when none was given."""
        if not self.model:
            models = await get_json(self.host, self.port, self.models_path, api_key=self.api_key)
            data = models.get("data") or []
            if not data:
                raise SystemExit(f"{self.name}: GET {self.models_path} lists no model")
            self.model = data[0]["id"]

    async def close(self) -> None:
        self.client.close()

    def body(self, spec: RequestSpec) -> bytes:
        w = self.workload
        body: dict[str, object] = {
            "model": self.model,
            "max_tokens": spec.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": w.temperature,
        }
        if w.ignore_eos:
            body["ignore_eos"] = True
        if spec.messages:
            body["messages"] = [{"role": r, "content": c} for r, c in spec.messages]
            if w.session_user:
                body["user"] = f"conversation-{spec.conversation}"
        elif w.api == "chat":
            body["messages"] = [{"role": "user", "content": spec.prompt}]
        else:
            body["prompt"] = spec.prompt
        return orjson.dumps(body)

    async def request(self, spec: RequestSpec) -> RequestRecord:
        body = self.body(spec)
        raw = self._head + str(len(body)).encode() + b"\r\n\r\n" + body
        rec = RequestRecord(target=self.name)
        sink = StreamSink(rec, "chat" if spec.messages else self.workload.api, self.stamp,
                          self._collect)  # fmt: skip

        def started(t: int) -> None:
            rec.start_ns = t

        try:
            parser, rx = await self.client.exchange(raw, sink, started, self.timeout)
        except TimeoutError:
            return rec.fail("timeout")
        except ProtocolError as exc:
            return rec.fail("protocol", str(exc))
        except ConnectionRefusedError as exc:
            return rec.fail("connect", str(exc))
        except (ConnectionError, OSError) as exc:
            return rec.fail("reset" if rec.start_ns else "connect", str(exc))
        rec.end_ns = time.perf_counter_ns()
        rec.rx_bytes = rx
        rec.rx_payload_bytes = parser.body_bytes
        rec.worker = parser.headers.get(b"x-sluice-worker", b"").decode()
        if parser.status != 200:
            return rec.fail(f"http_{parser.status}", parser.error_body.decode(errors="replace"))
        return finish_record(rec, sink)


def finish_record(rec: RequestRecord, sink: StreamSink) -> RequestRecord:
    """Token count, finish reason and the error kind once the response has ended."""
    rec.finish_reason = sink.finish
    rec.text = "".join(sink.parts)
    if sink.usage is not None:
        rec.tokens = int(sink.usage.get("completion_tokens") or 0)
        rec.prompt_tokens = int(sink.usage.get("prompt_tokens") or 0)
        details = sink.usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            rec.cached_tokens = int(details.get("cached_tokens") or 0)
        rec.usage_tokens = True
    else:
        rec.tokens = len(rec.event_ns)
    if sink.error:
        return rec.fail("stream_error", sink.error)
    if not sink.done_seen:
        return rec.fail("no_done", "the stream ended without data: [DONE]")
    if not rec.event_ns:
        return rec.fail("no_tokens")
    return rec


async def get_json(
    host: str, port: int, path: str, timeout: float = 10.0, api_key: str = ""
) -> dict:
    """A plain GET returning JSON (setup only: not on the measured path)."""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Connection: close\r\n\r\n"
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request.encode())
            raw = await reader.read()
        finally:
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" in head.lower():
        body = _dechunk(body)
    if status != 200:
        raise ConnectionError(f"GET {path}: HTTP {status}: {body[:200]!r}")
    return orjson.loads(body)


def _dechunk(body: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        nl = body.find(b"\r\n", pos)
        size = int(body[pos:nl].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[nl + 2 : nl + 2 + size])
        pos = nl + 2 + size + 2
