"""One constraint compiler: `python child.py VOCAB MB` (it imports nothing of Sluice).

Compiles constraints with xgrammar (the backend vLLM picks for everything it supports)
over the served model's vocabulary (VOCAB: `xgrammar.TokenizerInfo.serialize_json`), one at
a time, niced, one thread, its address space bounded to MB MiB above what it holds once
ready. Protocol, one JSON object a line: it writes {"ready": true} once loaded, then
answers each job {"method", "spec", "any_whitespace"} with {"ok": true}, {"error": msg}
or {"memory": true}. It dies with its parent (PR_SET_PDEATHSIG) and at end of input.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any, TextIO

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the end of input still ends it
        pass


def _address_space() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


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


def serve(vocab_path: str, limit_mb: int, out: TextIO) -> None:
    import xgrammar as xgr

    with open(vocab_path) as f:
        info = xgr.TokenizerInfo.deserialize_json(f.read())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    room = _address_space() + limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        reply: dict[str, Any]
        try:
            compile_job(compiler, json.loads(line))
            reply = {"ok": True}
        except MemoryError:
            reply = {"memory": True}
        except Exception as exc:  # the backend's refusal, in its own words
            reply = {"error": str(exc)[:2000] or type(exc).__name__}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main() -> None:
    _die_with_parent()
    os.nice(10)  # a compile takes CPU the engine's streams would otherwise have
    # Replies go to the original stdout; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    serve(sys.argv[1], int(sys.argv[2]), out)


if __name__ == "__main__":
    main()
