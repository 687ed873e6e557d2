"""One constraint compiler, a process forked from multiprocessing's fork server (which
imported xgrammar once, so a new compiler is ready in milliseconds).

It compiles with xgrammar, the backend vLLM picks for everything it supports, over the
served model's vocabulary (a file of `xgrammar.TokenizerInfo.serialize_json`), one job at
a time, on one thread, in the idle scheduling class (`SCHED_IDLE`: on CPU no stream
wants), its address space bounded to `limit_mb` MiB above what it holds once ready. Over
its pipe, JSON both ways: b'{"ready": true}' once loaded, then for each job {"method",
"spec", "any_whitespace"} one of {"ok": true}, {"error": msg} or {"memory": true}. It ends
when the pipe closes or its parent (the fork server, which ends with the worker) dies.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
from multiprocessing.connection import Connection
from typing import Any

PR_SET_PDEATHSIG = 1


def serve(conn: Connection, vocab_path: str, limit_mb: int) -> None:
    """The process's target: load, bound itself, then answer jobs until the pipe closes."""
    _die_with_parent()
    background()
    import xgrammar as xgr

    try:
        with open(vocab_path) as f:
            info = xgr.TokenizerInfo.deserialize_json(f.read())
    except FileNotFoundError:  # the pool closed (its worker stopped) while this one started
        return
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    room = _address_space() + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            raw = conn.recv_bytes()
        except EOFError:
            return
        reply: dict[str, Any]
        try:
            compile_job(compiler, json.loads(raw))
            reply = {"ok": True}
        except MemoryError:
            reply = {"memory": True}
        except Exception as exc:  # the backend's refusal, in its own words
            text = str(exc)
            # C++'s std::bad_alloc comes through xgrammar's bindings as a RuntimeError.
            reply = {"memory": True} if "bad_alloc" in text else {"error": text[:2000]}
        conn.send_bytes(json.dumps(reply).encode())


def compile_job(compiler: Any, job: dict[str, Any]) -> None:
    """Compile one job as vLLM's xgrammar backend does (its method names are xgrammar's)."""
    method, spec = job["method"], job["spec"]
    if method == "json_schema":
        compiler.compile_json_schema(spec, any_whitespace=job.get("any_whitespace", True))
    elif method == "regex":
        compiler.compile_regex(spec)
    elif method == "lark":
        compiler.compile_lark(spec)
    elif method == "ebnf":
        compiler.compile_grammar(spec)
    else:
        raise ValueError(f"unknown compile method {method!r}")


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pipe's end still ends it
        pass


def background(pid: int = 0) -> None:
    """A compile takes only CPU nothing else wants (`pid` 0: this process). At nice 10 two
    compiles beside a steady stream still took ~2.3 CPU-seconds each in 5 s on 2 cores,
    and the stream's requests ran 20-45 % slower meanwhile (issue 28's canary). The pool
    sets it too, as soon as a child exists: none is listed before it is idle-class."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest niceness
        try:
            os.setpriority(os.PRIO_PROCESS, pid, 19)
        except (AttributeError, OSError):  # gone already, or no priorities here
            pass


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0
