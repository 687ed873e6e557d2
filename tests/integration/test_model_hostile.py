"""Hostile requests against the session's real vLLM worker through a real edge (issue
28; the cases in `hostile_cases.py`): every case is a 400 naming its field within its
bound, a canary's p99 beside them stays within 1.5x of its own unloaded p99 (both measured
here), and the worker is the same process after. The worker's up-front bounds
(`intake/bounds.py`) and the edge's (`api/nesting.py`, `api/sizes.py`) refuse most in
milliseconds; what passes them is compiled once in a bounded child first (`constraints/`):
3,000 optional properties and 100 KB of `(a|b)`, inside every up-front bound, compile for
tens of seconds to minutes (on the engine, a canary beside the first went from 0.22 to
2.9 s at p99). Bodies over 64 KiB are parsed off the edge's and the worker's event loops:
inline, 128 tools of 25 KB held every stream the edge relayed for ~100 ms each."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from generated import sluice_pb2 as pb
from tests.integration.edge_fixtures import EDGE_ENV, direct_generate, wait_ready
from tests.integration.hostile_cases import (
    BODIES,
    CANARY,
    COMPILE_S,
    CONSTRAINTS,
    DEEP_ARGS,
    Case,
    props,
    schema,
    slow_cases,
)
from tests.procs import Proc, start_edge
from tests.waits import eventually

pytestmark = pytest.mark.model

CASES = {**CONSTRAINTS, **BODIES}
# Twice as many as run beside the cases: the unloaded p99 (of so few, the slowest) is the
# bound's base, and 16 put it anywhere from 1.0x to 1.4x their median.
UNLOADED_SAMPLES = 32
WARM_UP = 3
PER_CANARY = 2  # cases sent beside each canary
# A stall (issue 28: 13x beside one compile) comes back every round, with fresh slow
# cases; the shared machine's hiccups do not. In the project's CI a round's canary was
# over 1.5x in about 2 runs of 5 (once 4x: one canary of 1.3 s among 0.27-0.4 s ones).
ROUNDS = 4
BOUND = 1.5  # the issue's: loaded p99 over unloaded p99
CEILING = 2.5  # every round: the second-slowest loaded canary over the unloaded p99
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def edge(vllm_worker: Proc) -> Iterator[Proc]:
    # One session: the canary shares the hostile starts' Session RPC, whose reader a
    # compile must not hold.
    e = start_edge("--worker", vllm_worker.address, "--sessions-per-worker", "1", env=EDGE_ENV)
    try:
        wait_ready(f"http://{e.address}", timeout=30)
        yield e
    finally:
        e.kill()


def _p99(samples: list[float]) -> float:
    """Nearest rank: under 100 samples, the largest."""
    ranked = sorted(samples)
    return ranked[min(len(ranked) - 1, int(0.99 * len(ranked)))]


def _summary(loaded: list[float], unloaded: list[float]) -> dict[str, object]:
    """A round's canary, for the failure's message: the ratio, each side's p99 and the
    loaded samples in the order they ran (which case a slow one went beside)."""
    return {
        "ratio": round(_p99(loaded) / _p99(unloaded), 2),
        "p99": (round(_p99(loaded), 3), round(_p99(unloaded), 3)),
        "loaded": [round(t, 3) for t in loaded],
    }


def _gc_pauses(*procs: Proc) -> list[str]:
    """The slow collections the processes logged (`sluice_common/gcpause.py`)."""
    return [line for proc in procs for line in proc.log().splitlines() if "gc pause" in line]


def _canary(http: httpx.Client, answer: str | None = None) -> float:
    t0 = time.monotonic()
    resp = http.post("/v1/chat/completions", json=CANARY)
    took = time.monotonic() - t0
    assert resp.status_code == 200, resp.text
    if answer is not None:
        assert resp.json()["choices"][0]["message"]["content"] == answer
    return took


def test_hostile_requests_are_400s_in_bound_beside_a_steady_canary(
    edge: Proc, vllm_worker: Proc
) -> None:
    """The canary alone (its unloaded p99), every case with the canary on the same Session
    RPC beside them, two beside each canary (the two slow compiles together first, on the
    worker's two compilers, then the fast ones), the canary alone again.

    Two per canary, not the 23 fast ones back to back: those hold 8 MB of JSON, ~0.3
    CPU-seconds of the edge's and the worker's parsing within 0.5 s, and on 2 cores beside
    the engine's one that slowed the canary they overlapped by up to 1.7x, as 8 MB of
    ordinary bodies would. That is CPU; this bounds stalls.

    Another round (fresh slow cases) while a round's canary is over the bound: on this
    shared 2-core machine the slowest of 32 canaries with nothing else running was 0.27 to
    0.58 s from one run to the next, a swing the ratio of two maxima inherits, and a
    single canary of a round can be 4x the others. A stall in the worker or the edge
    comes back every round. Every round must answer every case in bound and keep its
    second-slowest canary within 2.5x; one round of `ROUNDS` must keep the canary's p99
    within 1.5x."""
    pid = vllm_worker.pid
    base = f"http://{edge.address}"
    seen: list[dict[str, object]] = []
    with httpx.Client(base_url=base, timeout=60) as http:
        first = http.post("/v1/chat/completions", json=CANARY)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        for _ in range(WARM_UP):  # a worker just started answers its first ones slower
            _canary(http, answer)
        for k in range(ROUNDS):
            cases = {**CASES, **slow_cases(k)}
            answers, unloaded, loaded = _round(http, base, answer, cases)
            outcomes = {name: (status, param) for name, (status, param, _) in answers.items()}
            times = {name: round(took, 3) for name, (_, _, took) in answers.items()}
            assert outcomes == {name: (400, case.field) for name, case in cases.items()}
            over = {name: t for name, t in times.items() if t >= cases[name].bound_s}
            assert not over, (k, over, seen)
            seen.append(_summary(loaded, unloaded))
            # One slow canary may be this machine's; a second is a slowdown in any round.
            second = sorted(loaded)[-2]
            assert second <= CEILING * _p99(unloaded), (seen, _gc_pauses(edge, vllm_worker))
            if _p99(loaded) <= BOUND * _p99(unloaded):
                break
        else:
            raise AssertionError(
                f"every round's canary was over {BOUND}x: {seen}; {_gc_pauses(edge, vllm_worker)}"
            )
    assert vllm_worker.pid == pid and vllm_worker.proc.poll() is None


def _round(
    http: httpx.Client, base: str, answer: str, cases: dict[str, Case]
) -> tuple[dict[str, tuple[int, str, float]], list[float], list[float]]:
    """One measurement: each case's (status, param, seconds), the unloaded canaries (half
    before, half after the cases: a machine shared with other work is measured under the
    same conditions on both sides) and those beside the cases."""
    unloaded = [_canary(http, answer) for _ in range(UNLOADED_SAMPLES // 2)]
    loaded: list[float] = []
    stop, ended = threading.Event(), threading.Event()
    started = threading.Condition()

    def canary_loop() -> None:
        try:
            with httpx.Client(base_url=base, timeout=60) as own:
                while not stop.is_set():
                    took = _canary(own, answer)
                    with started:
                        loaded.append(took)
                        started.notify()
        finally:
            with started:
                ended.set()
                started.notify()

    def paced(i: int, name: str) -> tuple[int, str, float]:
        """The i-th case, once the canary it goes beside has started."""
        with started:
            started.wait_for(lambda: i < PER_CANARY * (len(loaded) + 1) or ended.is_set(), 60)
        if ended.is_set():
            canaries.result(timeout=0)  # its error, if it failed
        assert i < PER_CANARY * (len(loaded) + 1), "the canary stopped"
        return hostile(name)

    def hostile(name: str) -> tuple[int, str, float]:
        """Status, the error's param (else the body's start: an answer that is no error)
        and seconds."""
        case = cases[name]
        t0 = time.monotonic()
        resp = http.post(case.route, content=case.body, headers=JSON)
        took = time.monotonic() - t0
        try:
            return resp.status_code, resp.json()["error"].get("param"), took
        except (ValueError, KeyError, TypeError, AttributeError):
            return resp.status_code, resp.text[:200], took

    slow_names = slow_cases().keys()  # every round's
    slow = [name for name in cases if name in slow_names]
    with concurrent.futures.ThreadPoolExecutor(1 + len(slow)) as pool:
        canaries = pool.submit(canary_loop)
        try:
            compiling = {name: pool.submit(hostile, name) for name in slow}
            fast = [name for name in cases if name not in slow]
            answers = {name: paced(i, name) for i, name in enumerate(fast, len(slow))}
            answers |= {name: f.result(timeout=60) for name, f in compiling.items()}
        finally:  # the canary stops however the cases ended
            stop.set()
        canaries.result(timeout=60)
    unloaded += [_canary(http, answer) for _ in range(UNLOADED_SAMPLES // 2)]
    return answers, unloaded, loaded


def test_the_worker_names_history_arguments_too_deep_over_grpc(vllm_worker: Proc) -> None:
    """A direct gRPC caller, past no edge: the worker refuses the history call's 5,000
    `[` itself (its decoder raised RecursionError as INTERNAL, a 502 at the edge)."""
    start = pb.StartGeneration(request_id="deep-args")
    start.chat.messages.add(role="user", content="hi")
    start.chat.messages.add(role="assistant").tool_calls.add(id="c", name="f", arguments=DEEP_ARGS)
    with pytest.raises(grpc.RpcError) as info:
        direct_generate(vllm_worker.address, start)
    err = info.value
    assert (err.code(), err.details()) == (  # type: ignore[attr-defined]
        grpc.StatusCode.INVALID_ARGUMENT,
        "chat.messages[1].tool_calls[0].arguments: nests deeper than 64 levels of objects "
        "and arrays",
    )


def _compilers(worker_pid: int) -> set[int]:
    """The worker's constraint compilers: the children of its multiprocessing fork server."""
    parents: dict[int, int] = {}
    servers = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents[int(entry)] = ppid
        if ppid == worker_pid and b"forkserver" in cmdline:
            servers.add(int(entry))
    return {pid for pid, ppid in parents.items() if ppid in servers}


def _both(worker_pid: int) -> set[int] | None:
    found = _compilers(worker_pid)
    return found if len(found) == 2 else None


def test_a_compile_whose_client_left_is_abandoned(edge: Proc, vllm_worker: Proc) -> None:
    """The client leaves during a slow compile: its compiler is killed then, well before
    the compile bound would have ended it, and a new one takes its place."""
    before = eventually(lambda: _both(vllm_worker.pid), what="the worker's two compilers")
    body = {**CANARY, **schema(props(3_000, False, first=10_000))}  # not compiled yet
    with httpx.Client(base_url=f"http://{edge.address}", timeout=1.0) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body)
    left = time.monotonic()
    gone = eventually(
        lambda: before - _compilers(vllm_worker.pid), what="the abandoned compiler ended"
    )
    assert time.monotonic() - left < COMPILE_S / 2 and len(gone) == 1
    eventually(lambda: _both(vllm_worker.pid), what="a compiler in its place")
