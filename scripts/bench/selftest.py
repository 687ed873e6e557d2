"""The SSE reader's own speed: parse a synthetic response, no socket, no server.

The buffer is what our edge sends: an HTTP/1.1 head, then one HTTP chunk per event, each
an `id:` line and an OpenAI chat chunk with a `sluice_worker_time_ns` stamp (~330 bytes),
then the usage chunk and `data: [DONE]`. It is fed in 64 KiB reads through the same parser and
sink the harness uses, so the figure is the harness's ceiling in events/s per core.
"""

from __future__ import annotations

import time
import zlib

import orjson

from scripts.bench.openai_driver import StreamSink, finish_record
from scripts.bench.record import RequestRecord
from scripts.bench.sse_reader import ResponseParser

READ_SIZE = 65536


def chat_event(i: int, stamp: int) -> bytes:
    """One token event as our edge writes it: an `id:` line (for resuming), then the chunk."""
    chunk = {
        "id": "chatcmpl-0123456789abcdef0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": 1767225600,
        "model": "SmolLM2-135M-Instruct",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "delta": {"content": f" tok{i % 97}"},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "usage": None,
        "sluice_worker_time_ns": stamp + i,
    }
    event_id = b"ZmM1ZmFhOWM0MWI2NGUzZDliNzlmYTMxZGE4NThiY2Q.%d.%d" % (i + 1, i + 1)
    return b"id: " + event_id + b"\ndata: " + orjson.dumps(chunk) + b"\n\n"


def synthetic_response(events: int, gzip: bool = False) -> bytes:
    """A complete chunked SSE response with `events` token events (each chunk flushed on
    its own in one gzip member, with `gzip`)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    head += b"content-encoding: gzip\r\n\r\n" if gzip else b"\r\n"
    stamp = time.time_ns()
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    usage = orjson.dumps(
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": events}}
    )
    bodies = [role, *(chat_event(i, stamp) for i in range(events))]
    bodies += [b"data: " + usage + b"\n\n", b"data: [DONE]\n\n"]
    if gzip:
        z = zlib.compressobj(1, zlib.DEFLATED, 16 + 10)
        bodies = [z.compress(b) + z.flush(zlib.Z_SYNC_FLUSH) for b in bodies[:-1]] + [
            z.compress(bodies[-1]) + z.flush()
        ]
    parts = [head]
    for body in bodies:
        parts.append(b"%x\r\n" % len(body) + body + b"\r\n")
    parts.append(b"0\r\n\r\n")
    return b"".join(parts)


def parse(buffer: bytes, stamp: bool = True) -> tuple[RequestRecord, ResponseParser, float, float]:
    """Feed `buffer` in 64 KiB reads; (record, parser, wall s, CPU s)."""
    rec = RequestRecord(target="selftest")
    sink = StreamSink(rec, "chat", stamp)
    parser = ResponseParser(sink)
    reads = [buffer[i : i + READ_SIZE] for i in range(0, len(buffer), READ_SIZE)]
    rec.start_ns = time.perf_counter_ns()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for data in reads:
        parser.feed(data, time.perf_counter_ns())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rec.end_ns = time.perf_counter_ns()
    return finish_record(rec, sink), parser, wall, cpu


def run(events: int = 200_000) -> dict[str, float]:
    buffer = synthetic_response(events)
    rec, parser, wall, cpu = parse(buffer)
    if not parser.done or rec.error or len(rec.event_ns) != events or rec.tokens != events:
        raise SystemExit(f"selftest: parse failed: {rec.error or 'incomplete'} {len(rec.event_ns)}")
    result = {
        "events": events,
        "bytes": len(buffer),
        "wall_s": round(wall, 4),
        "events_per_s": round(events / wall),
        "events_per_cpu_s": round(events / max(cpu, 1e-9)),
        "mb_per_s": round(len(buffer) / wall / 1e6, 1),
        "stamps": len(rec.stamp_lat_ns),
    }
    print(
        f"SSE reader: {events:,} events ({len(buffer) / 1e6:.1f} MB) in {wall * 1000:.0f} ms: "
        f"{result['events_per_s']:,} events/s, {result['mb_per_s']} MB/s "
        f"({result['events_per_cpu_s']:,} events per CPU-second)"
    )
    return result
