#!/usr/bin/env bash
# Runs a worker (real model through vLLM by default) and the edge in front of it.
# Ctrl-C (or SIGTERM) drains and stops both: the edge first, then the worker.
#   SLUICE_ENGINE=sim        use the simulated engine instead of vLLM
#   SLUICE_MODEL_DIR=DIR     any local HF model directory (default: converted SmolLM2)
#   SLUICE_TOOL_PARSER=NAME  vLLM tool parser for tool_choice auto (default: hermes)
#   WORKER_PORT / EDGE_PORT  ports (50051 / 8000)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
ENGINE=${SLUICE_ENGINE:-vllm}
MODEL_DIR=${SLUICE_MODEL_DIR:-$HOME/.cache/sluice/models/SmolLM2-135M-Instruct}
WORKER_PORT=${WORKER_PORT:-50051}
EDGE_PORT=${EDGE_PORT:-8000}

worker_args=(--engine "$ENGINE" --host 127.0.0.1 --port "$WORKER_PORT")
if [ "$ENGINE" = vllm ]; then
  # Tool choice "auto" (what the openai SDK sends with tools) through vLLM's Hermes parser:
  # SmolLM2 has no tool format of its own, so it answers in text unless told otherwise.
  worker_args+=(--model "$MODEL_DIR" --tool-call-parser "${SLUICE_TOOL_PARSER:-hermes}")
  # On CPU, size the KV cache explicitly: the default share of "GPU" memory is a share of
  # a node-memory figure that varies between runs here.
  if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
    worker_args+=(--kv-cache-space-gb 1)
  fi
fi

echo "==> starting worker ($ENGINE) on 127.0.0.1:$WORKER_PORT"
$PY -m model_service "${worker_args[@]}" ${SLUICE_WORKER_ARGS:-} &
WPID=$!
EPID=""
stop() {
  trap - EXIT INT TERM
  [ -n "$EPID" ] && kill -TERM "$EPID" 2>/dev/null && wait "$EPID" 2>/dev/null || true
  kill -TERM "$WPID" 2>/dev/null && wait "$WPID" 2>/dev/null || true
}
trap stop EXIT INT TERM

echo -n "==> waiting for the engine to load (first start on CPU takes ~30 s)"
$PY - "$WORKER_PORT" "$WPID" <<'PYEOF'
import os, sys, time
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
port, pid = sys.argv[1], int(sys.argv[2])
stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
t0 = time.monotonic()
while True:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("\nworker exited during start-up (see its log above)")
    try:
        if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
            print(f" ready in {time.monotonic() - t0:.0f}s")
            break
    except grpc.RpcError:
        pass
    print(".", end="", flush=True)
    time.sleep(1)
PYEOF

if [ -f edge/__main__.py ]; then
  echo "==> starting edge on http://127.0.0.1:$EDGE_PORT"
  $PY -m edge --worker "127.0.0.1:$WORKER_PORT" --host 127.0.0.1 --port "$EDGE_PORT" ${SLUICE_EDGE_ARGS:-} &
  EPID=$!
fi
cat <<TXT

Sluice is up.
  gRPC worker : 127.0.0.1:$WORKER_PORT   (grpcurl -plaintext 127.0.0.1:$WORKER_PORT list)
  HTTP edge   : http://127.0.0.1:$EDGE_PORT/v1   (OpenAI-compatible; chat page at /)
Try:
  curl -N http://127.0.0.1:$EDGE_PORT/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"stream":true}'
Ctrl-C stops both.
TXT
wait "$WPID"
