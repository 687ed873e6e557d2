#!/usr/bin/env bash
# Edge CPU per request against the floor of its framework (issue 22, target 2). Alternating
# rounds, each a closed loop of h2load (HTTP/1.1, 64 connections, 20,000 requests, after
# 3,000 to warm up), the server's utime+stime over the loop divided by the requests:
#   edge 200: a 1-token streamed chat through the edge to a sim worker (the bench's shape)
#   edge 404: the same body naming a model nobody serves (parsed, checked, routed, refused)
#   bare 404: Starlette under the same uvicorn (uvloop, httptools): read the body, parse
#             its JSON, answer a JSON 404; no middleware, no routing
# usage: scripts/edge_floor.sh ROUNDS   (h2load: scripts/deploy/install_nginx.sh)
set -u
cd "$(dirname "$0")/.."
rounds=${1:-2}
py=$PWD/.venv/bin/python; d=$(mktemp -d); ticks=$(getconf CLK_TCK)
cat > "$d/bare.py" <<'EOF'
import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route


async def chat(request):
    body = orjson.loads(await request.body())
    error = {"error": {"message": f"model {body.get('model')!r} is not served here"}}
    return Response(orjson.dumps(error), status_code=404, media_type="application/json")


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
EOF
body() {
  printf '{"model":"%s","max_tokens":1,"stream":true,"stream_options":{"include_usage":true},' "$1"
  printf '"temperature":0,"messages":[{"role":"user","content":"hello there, how are you today?"}]}'
}
body sim-model > "$d/ok.json"; body nobody > "$d/missing.json"
wait_port() { for _ in $(seq 100); do [ -s "$1" ] && break; sleep 0.2; done; }
# measure PID URL BODY: prints the server's CPU µs per request and the status codes
measure() {
  local url="http://127.0.0.1:$2/v1/chat/completions" h=(-H 'content-type: application/json')
  h2load --h1 -n 3000 -c 64 -d "$3" "${h[@]}" "$url" > /dev/null 2>&1
  local t0 t1; t0=$(awk '{print $14+$15}' "/proc/$1/stat")
  h2load --h1 -n 20000 -c 64 -d "$3" "${h[@]}" "$url" > "$d/h2load.txt" 2>&1
  t1=$(awk '{print $14+$15}' "/proc/$1/stat")
  echo "$(python3 -c "print(round(($t1-$t0)/$ticks*1e6/20000, 1))")" \
    "($(awk '/^status codes/ {print $3 " 2xx, " $7 " 4xx, " $9 " 5xx"}' "$d/h2load.txt"))"
}
echo "| round | edge 200 µs | edge 404 µs | bare 404 µs |"
echo "| ---: | ---: | ---: | ---: |"
for r in $(seq "$rounds"); do
  rm -f "$d/wport" "$d/eport"
  $py -m model_service --engine sim --host 127.0.0.1 --port 0 --port-file "$d/wport" \
    --sim-ttft=0 --sim-token-delay=0 --max-num-seqs=1024 --max-waiting=1024 \
    --sim-kv-tokens=262144 --max-model-len=2048 > "$d/worker.log" 2>&1 &
  wpid=$!; wait_port "$d/wport"
  $py -m edge --worker="127.0.0.1:$(cat "$d/wport")" --host 127.0.0.1 --port 0 \
    --port-file "$d/eport" > "$d/edge.log" 2>&1 &
  epid=$!; wait_port "$d/eport"
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$(cat "$d/eport")/readyz" >/dev/null && break; sleep 0.2; done
  ok=$(measure "$epid" "$(cat "$d/eport")" "$d/ok.json")
  missing=$(measure "$epid" "$(cat "$d/eport")" "$d/missing.json")
  kill "$epid" "$wpid"; wait "$epid" "$wpid" 2>/dev/null
  $py -m uvicorn --app-dir "$d" bare:app --host 127.0.0.1 --port 8099 --loop uvloop \
    --http httptools --no-access-log --log-level warning > "$d/bare.log" 2>&1 &
  bpid=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:8099/" && break; sleep 0.2; done
  bare=$(measure "$bpid" 8099 "$d/missing.json")
  kill "$bpid"; wait "$bpid" 2>/dev/null
  echo "| $r | $ok | $missing | $bare |"
done
rm -rf "$d"
