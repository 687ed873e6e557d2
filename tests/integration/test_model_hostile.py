"""Hostile constraints against the session's real vLLM worker through a real edge (issue
28): every case is a 400 naming its field within its bound, a canary's p99 beside the slow
compiles stays within 1.5x of its own unloaded p99 (both measured here), and the worker is
the same process after. The up-front bounds (`intake/bounds.py`) refuse most in
milliseconds; what passes them is compiled once in a bounded child first (`constraints/`):
3,000 optional properties and 100 KB of `(a|b)`, inside every up-front bound, compile for
tens of seconds to minutes (on the engine, a canary beside the first went from 0.22 to
2.9 s at p99)."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import Proc, start_edge
from tests.waits import eventually

pytestmark = pytest.mark.model

COMPILE_S = 5.0  # the worker's --max-constraint-compile-s (its default)
CANARY: dict[str, Any] = {
    "model": "",
    "messages": [{"role": "user", "content": "Name a river."}],
    "max_tokens": 8,
    "temperature": 0,
}
UNLOADED_SAMPLES = 16  # about as many as run beside the cases


def _props(n: int, required: bool, first: int = 0) -> dict[str, Any]:
    p = {f"p{i}": {"type": "string"} for i in range(first, first + n)}
    return {"type": "object", "properties": p, **({"required": list(p)} if required else {})}


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


# The edge names a structured output's field `response_format.<kind>` whichever parameter
# set it (guided_*, structured_outputs too); a nesting refusal names where it is.
RF = "response_format.json_schema"
CHAIN = "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(4_999))
ENUM = {"enum": ["e" * 200 + str(i) for i in range(5_000)]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": _props(10_000, True)}}
CHOICES = [f"{i}" + "c" * 1023 for i in range(1_000)]
SELF_REF = {"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}
REQUIRED_TOOL = {"tools": [TOOL], "tool_choice": "required"}
# (the body's constraint, the field the 400 names, the bound in seconds)
HOSTILE: dict[str, tuple[dict[str, Any], str, float]] = {
    "10,000 required properties": (_schema(_props(10_000, True)), RF, 1.0),
    "10,000 optional properties": (_schema(_props(10_000, False)), RF, 1.0),
    "5,000 enum strings of 200": (
        {"structured_outputs": {"json": ENUM}},
        RF,
        1.0,
    ),
    "$ref n -> n": (_schema(SELF_REF), RF, 1.0),
    "$ref a -> a": (_schema({"$ref": "#"}), RF, 1.0),
    "a schema nested 260 levels": (_schema(_nested(260)), f"{RF}.schema.items.items", 1.0),
    "1,000 choices of 1 KB": ({"guided_choice": CHOICES}, "response_format.choice", 1.0),
    "a{0,100000}": ({"guided_regex": "a{0,100000}"}, "response_format.regex", 1.0),
    "a chain of 5,000 grammar rules": ({"guided_grammar": CHAIN}, "response_format.grammar", 1.0),
    "an unclosed regex group": ({"guided_regex": "(a"}, "response_format.regex", 1.0),
    "a grammar naming no rule": (
        {"guided_grammar": "root ::= nothing"},
        "response_format.grammar",
        1.0,
    ),
    "10,000 required tool parameters": (REQUIRED_TOOL, "tools", 1.0),
    # Inside every up-front bound; their compiles are over the worker's time bound.
    "3,000 optional properties": (_schema(_props(3_000, False)), RF, COMPILE_S + 2.0),
    "100 KB of (a|b)": (
        {"guided_regex": "(a|b)" * 20_000},
        "response_format.regex",
        COMPILE_S + 2.0,
    ),
}


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


def _canary(http: httpx.Client, answer: str | None = None) -> float:
    t0 = time.monotonic()
    resp = http.post("/v1/chat/completions", json=CANARY)
    took = time.monotonic() - t0
    assert resp.status_code == 200, resp.text
    if answer is not None:
        assert resp.json()["choices"][0]["message"]["content"] == answer
    return took


def test_hostile_constraints_are_400s_in_bound_beside_a_steady_canary(
    edge: Proc, vllm_worker: Proc
) -> None:
    """The canary's unloaded p99 first; then the cases, the canary on the same Session RPC
    beside the two slow compiles."""
    pid = vllm_worker.pid
    base = f"http://{edge.address}"
    with httpx.Client(base_url=base, timeout=60) as http:
        first = http.post("/v1/chat/completions", json=CANARY)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        unloaded = [_canary(http, answer) for _ in range(UNLOADED_SAMPLES)]

        loaded: list[float] = []
        stop = threading.Event()

        def canary_loop() -> None:
            with httpx.Client(base_url=base, timeout=60) as own:
                while not stop.is_set():
                    loaded.append(_canary(own, answer))

        def hostile(name: str) -> tuple[int, str, float]:
            t0 = time.monotonic()
            resp = http.post("/v1/chat/completions", json={**CANARY, **HOSTILE[name][0]})
            return resp.status_code, resp.json()["error"].get("param"), time.monotonic() - t0

        # Those refused before any compile one by one, then the slow compiles together (on
        # the worker's two compilers) with the canary beside them. Beside the 1 MB bodies
        # the first canary took up to 1.7x its median: their parsing, on the edge's and the
        # worker's loops, is not measured here (issue 28 keeps it open).
        slow = [name for name, (_, _, bound) in HOSTILE.items() if bound > 1.0]
        answers = {name: hostile(name) for name in HOSTILE if name not in slow}
        with concurrent.futures.ThreadPoolExecutor(1 + len(slow)) as pool:
            beside = pool.submit(canary_loop)
            compiling = {name: pool.submit(hostile, name) for name in slow}
            answers |= {name: f.result(timeout=60) for name, f in compiling.items()}
            stop.set()
            beside.result(timeout=60)
    outcomes = {name: (status, param) for name, (status, param, _) in answers.items()}
    times = {name: round(took, 3) for name, (_, _, took) in answers.items()}
    assert outcomes == {name: (400, field) for name, (_, field, _) in HOSTILE.items()}
    assert _p99(loaded) <= 1.5 * _p99(unloaded), (unloaded, loaded)
    assert all(times[name] < bound for name, (_, _, bound) in HOSTILE.items()), times
    assert vllm_worker.pid == pid and vllm_worker.proc.poll() is None


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
    body = {**CANARY, **_schema(_props(3_000, False, first=10_000))}  # not compiled yet
    with httpx.Client(base_url=f"http://{edge.address}", timeout=1.0) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body)
    left = time.monotonic()
    gone = eventually(
        lambda: before - _compilers(vllm_worker.pid), what="the abandoned compiler ended"
    )
    assert time.monotonic() - left < COMPILE_S / 2 and len(gone) == 1
    eventually(lambda: _both(vllm_worker.pid), what="a compiler in its place")
