"""The peers the edge is measured against, each started on 127.0.0.1 on a free port
(the `[bench]` extra, pinned: their CPU is the figure we compare with):

- vLLM's Rust router (`vllm-router`) in front of an edge (overhead mode's `router`);
- SGLang's gateway, SMG (`smg launch`), in front of an edge (overhead mode's `smg`): the
  same HTTP proxying of the same SSE stream;
- SMG's gRPC router in front of vLLM's own gRPC server (compare mode's `smg-grpc`): the
  gRPC-first stack a user would pick instead of ours; the router tokenizes, applies the
  chat template and detokenizes, the engine serves token ids.

Their metrics servers bind 127.0.0.1 on other free ports; nothing is fetched from outside
(the tokenizer comes from the model directory, HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from scripts.bench.stacks import Proc, free_port, models_ready, spawn, wait_ready

# With one backend a policy has nothing to choose; round_robin is the cheapest (cache_aware,
# the routers' default, keeps a prefix tree per request). `extra` may override it.
ROUTER_DEFAULT_ARGS = ("--policy", "round_robin")
# SMG also logs two lines per request at its default level (info); the edge and vllm-router
# log none, so it runs at warn: its CPU is proxying, not logging.
SMG_DEFAULT_ARGS = ("--policy", "round_robin", "--log-level", "warn")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def console_script(name: str) -> list[str]:
    """A console script of the `[bench]` extra (beside this Python first, then on PATH), as argv.

    A Python script is run by this interpreter: its `#!` line names the Python of the
    environment it was installed from, which a copied or moved environment no longer has."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=path)
    if not found:
        raise SystemExit(
            f"{name} is not installed: `make bench` installs it, or "
            "`.venv/bin/python -m pip install -e '.[bench]'`"
        )
    with open(found, "rb") as f:
        head = f.readline()
    return [sys.executable, found] if head.startswith(b"#!") and b"python" in head else [found]


def _urls(edge_url: str | list[str]) -> list[str]:
    return [edge_url] if isinstance(edge_url, str) else edge_url


def start_vllm_router(edge_url: str | list[str], extra: list[str], timeout: float = 60.0) -> Proc:
    """`vllm-router --worker-urls EDGE...` on a free port, waited until it lists the model.

    At start it polls `/health` on each backend before it listens (the edge serves it);
    `--health-check-endpoint` only sets what it polls afterwards."""
    port, metrics_port = free_port(), free_port()
    proc = spawn(
        "vllm-router",
        [*console_script("vllm-router"), "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *_urls(edge_url), "--health-check-endpoint", "/healthz",
         "--worker-startup-check-interval", "1", "--prometheus-host", "127.0.0.1",
         "--prometheus-port", str(metrics_port), *ROUTER_DEFAULT_ARGS, *extra],
    )  # fmt: skip
    proc.port = port
    return wait_ready(proc, lambda: models_ready(port), timeout)


def _smg(
    name: str, worker_urls: list[str], args: list[str], timeout: float, model: str = ""
) -> Proc:
    """`smg launch` on a free port with its Prometheus server on 127.0.0.1, waited until it
    lists the model (it registers its workers before it routes) and, given `model`, until
    it answers a one-token chat (in gRPC mode it lists the model before its tokenizer is
    loaded, and answers 503 meanwhile)."""
    port, metrics_port = free_port(), free_port()
    proc = spawn(
        name,
        [*console_script("smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *worker_urls, "--worker-startup-check-interval", "1",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), *args],
        OFFLINE,
    )  # fmt: skip
    proc.port = port
    wait_ready(proc, lambda: models_ready(port), timeout)
    return wait_ready(proc, lambda: not model or _answers(port, model), timeout)


def _answers(port: int, model: str) -> bool:
    """A one-token chat completion answered 200 (setup only)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_smg(edge_url: str | list[str], extra: list[str], timeout: float = 60.0) -> Proc:
    """SMG proxying HTTP to the edge(s): a pure load balancer, so no tokenizer is loaded."""
    args = ["--health-check-endpoint", "/healthz", "--disable-tokenizer-autoload",
            *SMG_DEFAULT_ARGS, *extra]  # fmt: skip
    return _smg("smg", _urls(edge_url), args, timeout)


def start_smg_grpc(
    worker_address: str, model_dir: str, extra: list[str], timeout: float = 300.0
) -> Proc:
    """SMG's gRPC router in front of a vLLM gRPC server at `worker_address` (host:port),
    with the model directory's tokenizer and chat template."""
    args = ["--model-path", model_dir, *SMG_DEFAULT_ARGS, *extra]
    return _smg("smg-grpc", [f"grpc://{worker_address}"], args, timeout, model=model_dir)
