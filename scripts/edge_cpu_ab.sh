#!/usr/bin/env bash
# Edge CPU per token event, A/B: two checkouts (each with its .venv), alternating.
# A sim worker at 50 tokens/s per stream, the edge, 64 streams of 500 tokens; the edge's
# utime+stime over 10 s of steady load, divided by the events the harness received (and,
# with the worker's, by the requests: OUTPUT_TOKENS=1 for the per-request A/B).
# usage: [OUTPUT_TOKENS=N] scripts/edge_cpu_ab.sh ROUNDS CHECKOUT_A CHECKOUT_B [edge flags...]
set -u
rounds=$1; a=$2; b=$3; shift 3
tokens=${OUTPUT_TOKENS:-500}
for _ in $(seq "$rounds"); do for tree in "$a" "$b"; do
  cd "$tree" || exit 1
  py=.venv/bin/python; d=$(mktemp -d)
  $py -m model_service --engine sim --host 127.0.0.1 --port 0 --port-file "$d/wport" \
    --sim-ttft=0 --sim-token-delay=0.02 --max-num-seqs=1024 --max-waiting=1024 \
    --sim-kv-tokens=262144 --max-model-len=2048 > "$d/worker.log" 2>&1 &
  wpid=$!
  for _ in $(seq 100); do [ -s "$d/wport" ] && break; sleep 0.2; done
  $py -m edge --worker="127.0.0.1:$(cat "$d/wport")" --host 127.0.0.1 --port 0 \
    --port-file "$d/eport" "$@" > "$d/edge.log" 2>&1 &
  epid=$!
  for _ in $(seq 100); do
    [ -s "$d/eport" ] && curl -sf "http://127.0.0.1:$(cat "$d/eport")/v1/models" >/dev/null && break
    sleep 0.2
  done
  $py -m scripts.bench --target sse --url "http://127.0.0.1:$(cat "$d/eport")" --concurrency 64 \
    --output-tokens "$tokens" --duration 20 --warmup 64 --no-plot --no-progress --no-stamp \
    --out "$d" --name load > "$d/bench.log" 2>&1 &
  bpid=$!
  sleep 6  # past the warm-up, into steady load
  t0=$(awk '{print $14+$15}' "/proc/$epid/stat"); w0=$(awk '{print $14+$15}' "/proc/$wpid/stat")
  sleep 10
  t1=$(awk '{print $14+$15}' "/proc/$epid/stat"); w1=$(awk '{print $14+$15}' "/proc/$wpid/stat")
  wait $bpid
  tps=$(grep -E "^\| steady tokens/s" "$d/load.md" | awk -F'|' '{print $3}' | tr -d ' ,')
  rps=$(grep -E "^\| requests/s" "$d/load.md" | awk -F'|' '{print $3}' | tr -d ' ,')
  ticks=$(getconf CLK_TCK)
  us() { python3 -c "print(round(($2-$1)/$ticks*1e6/10/$3,1))"; }
  echo "$tree edge_us_per_event=$(us "$t0" "$t1" "$tps") edge_us_per_request=$(us "$t0" "$t1" "$rps")" \
    "worker_us_per_request=$(us "$w0" "$w1" "$rps")"
  kill $epid $wpid; wait $epid $wpid 2>/dev/null
done; done
