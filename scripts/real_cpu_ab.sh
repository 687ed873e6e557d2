#!/usr/bin/env bash
# Real-model A/B (SmolLM2 on vLLM, `make model` first): two checkouts (each with its .venv),
# alternating; 16 streams x 64 tokens through the edge. Per run: tokens/s, and the
# worker's CPU ticks split into its own process (gRPC, sessions, tokenizing) and the
# engine's (vLLM's EngineCore and its workers), over the load only.
# usage: [ROUNDS=N] scripts/real_cpu_ab.sh CHECKOUT_A CHECKOUT_B
set -u
model=${MODEL_DIR:-$HOME/.cache/sluice/models/SmolLM2-135M-Instruct}
name=$(basename "$model")
for round in $(seq "${ROUNDS:-2}"); do for tree in "$@"; do
  cd "$tree" || exit 1
  py=.venv/bin/python; d=$(mktemp -d)
  $py -m model_service --engine vllm --model $model --host 127.0.0.1 --port 0 --port-file "$d/wport" \
    --max-model-len=2048 --max-num-seqs=32 --gpu-memory-utilization=0.3 --dtype=auto \
    --kv-cache-space-gb=1.0 --enforce-eager > "$d/worker.log" 2>&1 &
  wpid=$!
  for _ in $(seq 600); do [ -s "$d/wport" ] && break; sleep 0.5; done
  $py -m edge --worker="127.0.0.1:$(cat "$d/wport")" --host 127.0.0.1 --port 0 --port-file "$d/eport" > "$d/edge.log" 2>&1 &
  epid=$!
  for _ in $(seq 600); do
    [ -s "$d/eport" ] && curl -sf "http://127.0.0.1:$(cat "$d/eport")/v1/models" >/dev/null && break
    sleep 0.5
  done
  # wait until the worker is ready (a first request succeeds)
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$(cat "$d/eport")/v1/completions" -H 'content-type: application/json' \
      -d '{"model":"'"$name"'","prompt":"hi","max_tokens":2}' >/dev/null 2>&1 && break; sleep 1; done
  kids=$(pgrep -P $wpid | tr '\n' ' ')
  cpu() { local s=0; for p in "$@"; do s=$((s + $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0))); done; echo $s; }
  f0=$(cpu $wpid); k0=$(cpu $kids $(for k in $kids; do pgrep -P $k; done))
  $py -m scripts.bench --target sse --url "http://127.0.0.1:$(cat "$d/eport")" --concurrency 16 \
    --output-tokens 64 --requests 64 --warmup 16 --no-plot --no-progress --no-stamp --out "$d" --name load > "$d/bench.log" 2>&1
  f1=$(cpu $wpid); k1=$(cpu $kids $(for k in $kids; do pgrep -P $k; done))
  tps=$(grep -E "^\| tokens/s" "$d/load.md" | awk -F'|' '{print $3}' | tr -d ' ,')
  echo "$tree round=$round tokens_per_s=$tps front_ticks=$((f1-f0)) engine_ticks=$((k1-k0))"
  kill $epid; wait $epid 2>/dev/null; kill $wpid; wait $wpid 2>/dev/null
done; done
