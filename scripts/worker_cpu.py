"""The worker's own CPU cost per message and per request, with the simulated engine.

    python scripts/worker_cpu.py --label before          # both modes, ~40 s
    python scripts/worker_cpu.py --mode tokens --duration 15
    python scripts/worker_cpu.py --mode all --label mux   # + multiplexed requests, ~60 s

Starts `python -m model_service --engine sim --sim-ttft 0 --sim-token-delay 0.02` (room
for every stream: no admission refusals), then, from this process (the client, over one
channel as an edge would), runs one or both modes at `--concurrency` streams:

- tokens: long streams (ignore_eos) that each get one token every 20 ms, so every message
  carries one token. Reported: messages and tokens delivered in the window, the worker's
  CPU seconds in the same window, CPU per message.
- requests: back-to-back 1-token generations (max_tokens=1: a chunk and a final each),
  one Generate RPC each (simple mode, as the edge calls). Reported: requests/s and the
  worker's CPU per request.
- mux: the same generations over `--streams` multiplexed Generate RPCs (the contract's
  multiplexed mode: many starts on one stream, messages told apart by request id), so
  no RPC is set up per generation. What the worker would spend per request if the edge
  multiplexed its calls.

Worker CPU is utime + stime of /proc/PID/stat (all its threads: the event loop and gRPC's
poller), read at the start and the end of the window, after `--warmup` seconds.
Results go to scripts/results/worker-cpu.json under `--label` (other labels are kept).
This is a benchmark, not a test: numbers depend on the machine and its load.

`--floor` measures, with the same client, a bare grpc.aio server instead of the worker:
it answers each Generate with the same shape of RPC (read the start, a reader for the
rest, acceptance metadata, pre-serialized messages, status), with no engine and no
bookkeeping: 1-token chunks every 20 ms from one timer for all streams, or a chunk and a
final for max_tokens=1. What it costs is what grpc.aio costs; the worker can only add.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from generated import sluice_pb2 as pb  # noqa: E402
from model_service.server import write_port_file  # noqa: E402
from scripts import options as shared  # noqa: E402
from sluice_common.options import add_section, option, section_from  # noqa: E402
from tests.procs import Proc, start_worker  # noqa: E402

RESULTS = ROOT / "scripts" / "results" / "worker-cpu.json"
GENERATE = "/sluice.v1.Generation/Generate"
TICK_S = 1 / os.sysconf("SC_CLK_TCK")
WORKER_ARGS = (
    "--engine", "sim", "--sim-ttft", "0", "--sim-token-delay", "0.02",
    "--max-num-seqs", "1024", "--max-waiting", "1024", "--max-model-len", "8192",
)  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def start_msg(rid: str, max_tokens: int, ignore_eos: bool) -> bytes:
    sp = pb.SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, temperature=0)
    start = pb.StartGeneration(request_id=rid, prompt=f"measure the worker {rid}", sampling=sp)
    return pb.GenerateRequest(start=start).SerializeToString()


class Window:
    """The measured interval: counts only what arrives between `open` and `close`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.open = False
        self.messages = self.tokens = self.requests = 0
        self.cpu0 = self.t0 = 0.0
        self.cpu = self.wall = 0.0

    def start(self) -> None:
        self.open = True
        self.t0, self.cpu0 = time.monotonic(), cpu_seconds(self.pid)

    def stop(self) -> None:
        self.open = False
        self.cpu = cpu_seconds(self.pid) - self.cpu0
        self.wall = time.monotonic() - self.t0


async def tokens_mode(
    channel: grpc.aio.Channel, w: Window, concurrency: int, warmup: float, duration: float
) -> dict[str, Any]:
    generate = channel.stream_stream(GENERATE, request_serializer=None, response_deserializer=None)
    max_tokens = int((warmup + duration + 10) / 0.02)
    calls = []

    async def stream(i: int) -> None:
        call = generate(iter([start_msg(f"tok-{i}-{time.time_ns()}", max_tokens, True)]))
        calls.append(call)
        async for raw in call:
            if w.open:
                msg = pb.GenerateResponse.FromString(raw)
                w.messages += 1
                w.tokens += len(msg.chunk.token_ids)

    tasks = [asyncio.create_task(stream(i)) for i in range(concurrency)]
    await asyncio.sleep(warmup)
    w.start()
    await asyncio.sleep(duration)
    w.stop()
    for call in calls:
        call.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "concurrency": concurrency,
        "window_s": round(w.wall, 3),
        "messages": w.messages,
        "tokens": w.tokens,
        "tokens_per_message": round(w.tokens / max(w.messages, 1), 3),
        "messages_per_s": round(w.messages / w.wall, 1),
        "worker_cpu_s": round(w.cpu, 3),
        "worker_cpu_share": round(w.cpu / w.wall, 3),
        "worker_cpu_us_per_message": round(w.cpu / max(w.messages, 1) * 1e6, 1),
    }


async def requests_window(
    w: Window, tasks: list[asyncio.Task[None]], done: asyncio.Event, warmup: float, duration: float
) -> dict[str, Any]:
    """Measure `tasks` (back-to-back requests until `done`) over the window after
    `warmup`; what a requests mode reports."""
    await asyncio.sleep(warmup)
    w.start()
    await asyncio.sleep(duration)
    w.stop()
    done.set()
    await asyncio.gather(*tasks)
    return {
        "window_s": round(w.wall, 3),
        "requests": w.requests,
        "requests_per_s": round(w.requests / w.wall, 1),
        "worker_cpu_s": round(w.cpu, 3),
        "worker_cpu_share": round(w.cpu / w.wall, 3),
        "worker_cpu_us_per_request": round(w.cpu / max(w.requests, 1) * 1e6, 1),
    }


async def requests_mode(
    channel: grpc.aio.Channel, w: Window, concurrency: int, warmup: float, duration: float
) -> dict[str, Any]:
    generate = channel.stream_stream(GENERATE, request_serializer=None, response_deserializer=None)
    done = asyncio.Event()
    failures = 0

    async def loop(i: int) -> None:
        nonlocal failures
        n = 0
        while not done.is_set():
            n += 1
            try:
                async for _ in generate(iter([start_msg(f"req-{i}-{n}", 1, False)])):
                    pass
            except grpc.aio.AioRpcError:
                failures += 1
                continue
            if w.open:
                w.requests += 1

    tasks = [asyncio.create_task(loop(i)) for i in range(concurrency)]
    result = await requests_window(w, tasks, done, warmup, duration)
    return {"concurrency": concurrency, "failures": failures, **result}


async def mux_mode(
    channel: grpc.aio.Channel,
    w: Window,
    concurrency: int,
    warmup: float,
    duration: float,
    streams: int = 4,
) -> dict[str, Any]:
    generate = channel.stream_stream(GENERATE, request_serializer=None, response_deserializer=None)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def stream(k: int) -> None:
        call = generate()
        pending: dict[str, asyncio.Future[None]] = {}
        lock = asyncio.Lock()  # one write at a time on the stream
        first = True

        async def read() -> None:
            async for raw in call:
                msg = pb.GenerateResponse.FromString(raw)
                if msg.HasField("final"):
                    fut = pending.pop(msg.request_id, None)
                    if fut is not None:
                        fut.set_result(None)

        async def one(i: int) -> None:
            nonlocal first
            n = 0
            while not done.is_set():
                n += 1
                rid = f"mux-{k}-{i}-{n}"
                sp = pb.SamplingParams(max_tokens=1, temperature=0)
                start = pb.StartGeneration(
                    request_id=rid, prompt=f"measure the worker {rid}", sampling=sp
                )
                start.multiplexed = first  # the first start of the stream says so
                first = False
                fut = pending[rid] = loop.create_future()
                async with lock:
                    await call.write(pb.GenerateRequest(start=start).SerializeToString())
                await fut
                if w.open:
                    w.requests += 1

        reader = asyncio.create_task(read())
        await asyncio.gather(*(one(i) for i in range(concurrency // streams)))
        await call.done_writing()
        await reader

    tasks = [asyncio.create_task(stream(k)) for k in range(streams)]
    result = await requests_window(w, tasks, done, warmup, duration)
    return {"concurrency": concurrency, "streams": streams, **result}


MODES = {"tokens": tokens_mode, "requests": requests_mode, "mux": mux_mode}


@dataclass(frozen=True, slots=True)
class Options:
    mode: str = option(
        "both", "--mode", "both: tokens and requests; all: and mux", choices=(*MODES, "both", "all")
    )
    concurrency: int = shared.concurrency(64)
    duration: float = shared.duration(15.0, "measured seconds per mode")
    warmup: float = shared.warmup_s(3.0, "seconds before the window")
    label: str = option("run", "--label", "key of this run in the JSON file")
    worker_args: tuple[str, ...] = shared.worker_args()
    out: str = option(str(RESULTS), "--out", "the JSON file (other labels in it are kept)")
    floor: bool = option(False, "--floor", "measure a bare grpc.aio server", action="store_true")
    floor_loop: str = option(
        "auto",
        "--floor-loop",
        "the floor server's event loop",
        choices=("auto", "asyncio", "uvloop"),
    )
    # Set by `start_floor` for the floor server's own process.
    serve_floor: str = option("", "--serve-floor", argparse.SUPPRESS, metavar="PORT_FILE")


async def measure(opts: Options, address: str, pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    modes = ("tokens", "requests") if opts.mode == "both" else (opts.mode,)
    if opts.mode == "all":
        modes = ("tokens", "requests", "mux")
    async with grpc.aio.insecure_channel(address) as channel:
        for mode in modes:
            run = MODES[mode]
            window = Window(pid)
            out[mode] = await run(channel, window, opts.concurrency, opts.warmup, opts.duration)
            print(mode, json.dumps(out[mode]), flush=True)
    return out


async def serve_floor(port_file: str) -> None:
    """The bare grpc.aio server of `--floor` (module docstring)."""
    rid = "f" * 32
    chunk = pb.GenerateResponse(
        request_id=rid, index=1, chunk=pb.TokenChunk(text=" a", token_ids=[1])
    )
    final = pb.GenerateResponse(
        request_id=rid, index=1, final=pb.Final(reason=pb.FINISH_REASON_LENGTH)
    )
    chunk_raw, final_raw = chunk.SerializeToString(), final.SerializeToString()
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[None]] = []

    def step() -> None:
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)
        waiting.clear()
        loop.call_later(0.02, step)

    async def generate(requests: Any, context: grpc.aio.ServicerContext) -> None:
        start = (await context.read()).start

        async def watch() -> None:
            while await context.read() is not grpc.aio.EOF:
                pass

        reader = asyncio.create_task(watch())
        try:
            await context.send_initial_metadata((("x-sluice-request-id", start.request_id),))
            if start.sampling.max_tokens == 1:
                await context.write(chunk_raw)
                await context.write(final_raw)
                return
            while True:
                waiting.append(fut := loop.create_future())
                await fut
                await context.write(chunk_raw)
        finally:
            reader.cancel()

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        generate, request_deserializer=pb.GenerateRequest.FromString
    )
    generic = grpc.method_handlers_generic_handler("sluice.v1.Generation", {"Generate": handler})
    server.add_generic_rpc_handlers((generic,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    step()
    write_port_file(port_file, port)
    await server.wait_for_termination()


def start_floor(loop: str) -> Proc:
    port_file = Path(tempfile.mkdtemp(prefix="sluice-floor-")) / "port"
    log = port_file.with_name("log")
    cmd = [sys.executable, __file__, "--serve-floor", str(port_file), "--floor-loop", loop]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return Proc(proc, int(port_file.read_text()), log)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"floor server did not start:\n{log.read_text()}")


def git_commit() -> str:
    cmd = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_section(p, "cpu", Options)
    opts = section_from(p.parse_args(), "cpu", Options)
    if opts.serve_floor:
        from model_service.__main__ import run

        run(serve_floor(opts.serve_floor), opts.floor_loop)
        return 0
    worker_args = [*WORKER_ARGS, *opts.worker_args]
    if opts.floor:
        worker_args = ["(none: bare grpc.aio server, --floor-loop", opts.floor_loop + ")"]
        proc = start_floor(opts.floor_loop)
    else:
        proc = start_worker(*worker_args)
    try:
        results = asyncio.run(measure(opts, proc.address, proc.pid))
    finally:
        proc.terminate(10)
    record = {
        "commit": git_commit(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "grpcio": grpc.__version__,
        "worker": ("python -m model_service " if not opts.floor else "") + " ".join(worker_args),
        "client": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        **results,
    }
    path = Path(opts.out)
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[opts.label] = record
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(f"wrote {path} [{opts.label}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
