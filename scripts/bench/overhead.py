"""Overhead mode's figures: medians over rounds per target, the latency each hop adds, and
each server process's CPU per token event and per request.

Targets, each one hop longer than the last:

| target | path |
| --- | --- |
| `grpc` | harness -> worker (`Generate`) |
| `sse` | harness -> edge -> worker |
| `router` | harness -> vllm-router -> edge -> worker |
| `smg` | harness -> SMG (SGLang's gateway) -> edge -> worker |

`router` and `smg` are the peers (`PEERS`): proxies of the very same SSE stream, whose CPU
per event and per request the edge's is divided by (`edge_over_<peer>_cpu_per_*`).

Added latency: the worker stamps each message and the edge puts the stamp inside each
chunk's JSON, which a proxy passes on, so every target has a worker->client latency;
`edge_added_*` = sse - grpc, `<peer>_added_*` = peer - sse, `<peer>_edge_added_*` =
peer - grpc, percentile by percentile (medians over rounds). SMG does not pass the
request's stamp header on, so its stamp figures are empty (a `note smg` says so): with a
token delay its `lateness_*` (below) is the latency figure to compare.

CPU (`cpu`: target -> process -> figures, medians over rounds) comes from each run's
utime + stime of the watched processes over the measured window (`procwatch`), for the
processes on that target's path only:
- `cpu_us_per_event`: CPU / token events the harness received (at a sim token delay,
  1 token per event, so every event pays the whole path);
- `cpu_us_per_request`: CPU / successful requests (the per-request cost with
  `--output-tokens 1`);
- `requests_per_s_per_core`: requests/s divided by the cores the process used
  (= requests per CPU-second).
"""

from __future__ import annotations

from typing import Any

from scripts.bench.stats import median

# Process labels (the names stacks and peers give them).
WORKER, EDGE, ROUTER, SMG = "sim-worker", "edge", "vllm-router", "smg"
TARGETS = ("grpc", "sse", "router", "smg")
# The peer targets: a proxy in front of the edge, and its process.
PEERS = {"router": ROUTER, "smg": SMG}
# Which started processes a target's requests pass through; a process watched under
# another label (--watch-pid) is reported for every target.
PATHS = {
    "grpc": {WORKER},
    "sse": {WORKER, EDGE},
    **{target: {WORKER, EDGE, name} for target, name in PEERS.items()},
}
STARTED = (WORKER, EDGE, ROUTER, SMG)
# Issues 11 and 22: edge CPU per event <= each peer's; < 250 us CPU per request (1-token
# streams) for the edge and the worker.
EDGE_OVER_PEER_GOAL = 1.0
PER_REQUEST_GOAL_US = 250.0
PER_REQUEST_GOALS = (("sse", EDGE), ("grpc", WORKER), ("sse", WORKER))


def _target(run: dict[str, Any]) -> str:
    return str(run["label"]).split(" ")[0]


def _runs_of(runs: list[dict[str, Any]], target: str) -> list[dict[str, Any]]:
    return [r for r in runs if _target(r) == target]


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 4) if a is not None and b is not None else None


def _goal(value: float | None, limit: float) -> str:
    return "-" if value is None else "met" if value <= limit else "not met"


def _on_path(target: str, name: str) -> bool:
    return name in PATHS.get(target, ()) or name not in STARTED


def _path_order(name: str) -> tuple[int, str]:
    order = {WORKER: 0, EDGE: 1, ROUTER: 2, SMG: 2}
    return order.get(name, 3), name


def process_cpu(run: dict[str, Any], name: str) -> dict[str, float | None]:
    """One run's CPU figures for one watched process."""
    p = run["processes"][name]
    cpu_s, events, ok = p["cpu_s"], run["events_total"], run["requests"]["ok"]
    return {
        "cpu_pct": p["cpu_pct"],
        "cpu_us_per_event": round(cpu_s * 1e6 / events, 2) if events else None,
        "cpu_us_per_request": round(cpu_s * 1e6 / ok, 2) if ok else None,
        "requests_per_s_per_core": round(ok / cpu_s, 1) if cpu_s > 0 else None,
    }


def cpu_by_target(runs: list[dict[str, Any]], targets: tuple[str, ...]) -> dict[str, Any]:
    """target -> process -> CPU figures, medians over the target's rounds."""
    out: dict[str, Any] = {}
    for t in targets:
        mine = [r for r in _runs_of(runs, t) if r["processes"]]
        names = {n for r in mine for n in r["processes"] if _on_path(t, n)}
        per: dict[str, Any] = {}
        for name in sorted(names, key=_path_order):
            rounds = [process_cpu(r, name) for r in mine if name in r["processes"]]
            fig = per[name] = {k: median([x[k] for x in rounds]) for k in rounds[0]}
            # Per core from the median CPU per request, so the row agrees with itself (a
            # median of the rounds' own ratios is not the ratio of the medians).
            if fig["cpu_us_per_request"]:
                fig["requests_per_s_per_core"] = round(1e6 / fig["cpu_us_per_request"], 1)
        if per:
            out[t] = per
    return out


def _round_ratio(
    runs: list[dict[str, Any]], a: tuple[str, str], b: tuple[str, str], key: str
) -> float | None:
    """Median over rounds of (target a, process a)'s `key` / (target b, process b)'s,
    round by round (adjacent runs share the machine's state of the moment)."""
    ratios = []
    for ra, rb in zip(_runs_of(runs, a[0]), _runs_of(runs, b[0]), strict=False):
        if a[1] in ra["processes"] and b[1] in rb["processes"]:
            x, y = process_cpu(ra, a[1])[key], process_cpu(rb, b[1])[key]
            if x is not None and y:
                ratios.append(x / y)
    return median(ratios)


def _per_target(out: dict[str, Any], runs: list[dict[str, Any]], t: str, delay_s: float) -> None:
    mine = _runs_of(runs, t)
    out[f"{t}.tokens_per_s"] = median([r["tokens_per_s"] for r in mine])
    out[f"{t}.steady_tokens_per_s"] = median([r["steady_tokens_per_s"] for r in mine])
    out[f"{t}.requests_per_s"] = median([r["requests_per_s"] for r in mine])
    out[f"{t}.ttft_p50_ms"] = median([r["ttft_ms"].get("p50") for r in mine])
    for p in ("p50", "p99"):
        out[f"{t}.worker_to_client_{p}_ms"] = median([r["stamp_latency_ms"].get(p) for r in mine])
        held = [r.get("stamp_latency_all_open_ms", {}).get(p) for r in mine]
        if any(h is not None for h in held):  # every stream open at once (stats.summarize)
            out[f"{t}.worker_to_client_all_open_{p}_ms"] = median(held)
    out[f"{t}.rx_bytes_per_token"] = median([r["wire"]["rx_bytes_per_token"] for r in mine])
    out[f"{t}.payload_bytes_per_token"] = median(
        [r["wire"]["payload_bytes_per_token"] for r in mine]
    )
    out[f"{t}.tokens_per_event"] = median([r["tokens_per_event"] for r in mine])
    if delay_s > 0:
        for p in ("p50", "p99"):
            itl = median([r["itl_ms"].get(p) for r in mine])
            out[f"{t}.lateness_{p}_ms"] = _diff(itl, delay_s * 1000)


def _added_latency(out: dict[str, Any], targets: tuple[str, ...]) -> None:
    pairs = [("edge_added", "sse", "grpc")]
    for peer in PEERS:
        pairs += [(f"{peer}_added", peer, "sse"), (f"{peer}_edge_added", peer, "grpc")]
    for name, longer, shorter in pairs:
        if {longer, shorter} <= set(targets):
            for p in ("p50", "p99"):
                out[f"{name}_{p}_ms"] = _diff(
                    out[f"{longer}.worker_to_client_{p}_ms"],
                    out[f"{shorter}.worker_to_client_{p}_ms"],
                )
    for peer in PEERS:
        if peer in targets and out[f"{peer}.worker_to_client_p50_ms"] is None:
            # SMG forwards only a fixed list of request headers, X-Sluice-Stamp-Times not
            # among them: the edge is never asked for stamps through it.
            out[f"note {peer}"] = "no worker stamps through this peer; compare its lateness_*"
    if {"grpc", "sse"} <= set(targets):
        if out["sse.worker_to_client_p50_ms"] is None:
            out["note"] = "the edge did not forward worker stamps; edge_added_* unavailable"
        out["edge_added_ttft_p50_ms"] = _diff(out["sse.ttft_p50_ms"], out["grpc.ttft_p50_ms"])
        s, g = out["sse.rx_bytes_per_token"], out["grpc.rx_bytes_per_token"]
        out["wire_sse_over_grpc"] = round(s / g, 2) if s and g else None


def _edge_capacity(out: dict[str, Any], runs: list[dict[str, Any]], streams: int) -> None:
    """The edge's own cost while it carried the SSE runs (the worker's and harness's CPU
    compete on a small machine, so tokens per edge CPU-second is the capacity figure)."""
    sse_runs = [r for r in _runs_of(runs, "sse") if EDGE in r["processes"]]
    if not sse_runs:
        return
    edges = [r["processes"][EDGE] for r in sse_runs]
    out["edge.cpu_pct"] = median([e["cpu_pct"] for e in edges])
    out["edge.cpu_us_per_token"] = median(
        [e["cpu_s"] * 1e6 / r["tokens_total"] for e, r in zip(edges, sse_runs, strict=True)
         if r["tokens_total"]]
    )  # fmt: skip
    if out["edge.cpu_us_per_token"]:
        out["edge.capacity_tokens_per_s_per_core"] = round(1e6 / out["edge.cpu_us_per_token"])
    out["edge.rss_peak_mib"] = max(e["rss_peak_mib"] for e in edges)
    if streams:
        delta_kib = max((e["rss_peak_mib"] - e["rss_start_mib"]) * 1024 for e in edges)
        out["edge.rss_growth_kib_per_stream"] = round(delta_kib / streams, 2)


def _peers(out: dict[str, Any], runs: list[dict[str, Any]], cpu: dict[str, Any]) -> None:
    """The edge (SSE runs) against each peer that ran (its own runs), per event and per
    request: `edge.*`, `<process>.*`, `edge_over_<target>_cpu_per_*` and a goal line."""
    edge = cpu.get("sse", {}).get(EDGE)
    for target, name in PEERS.items():
        peer = cpu.get(target, {}).get(name)
        if not edge or not peer:
            continue
        for key in ("cpu_us_per_event", "cpu_us_per_request"):
            out[f"edge.{key}"] = edge[key]
            out[f"{name}.{key}"] = peer[key]
        for key, short in (("cpu_us_per_event", "event"), ("cpu_us_per_request", "request")):
            out[f"edge_over_{target}_cpu_per_{short}"] = _round_ratio(
                runs, ("sse", EDGE), (target, name), key
            )
        ratio = out[f"edge_over_{target}_cpu_per_event"]
        goal = f"goal edge_over_{target}_cpu_per_event <= {EDGE_OVER_PEER_GOAL}"
        out[goal] = _goal(ratio, EDGE_OVER_PEER_GOAL)


def _per_request_goals(out: dict[str, Any], cpu: dict[str, Any]) -> None:
    for target, name in PER_REQUEST_GOALS:
        value = cpu.get(target, {}).get(name, {}).get("cpu_us_per_request")
        if value is not None:
            key = f"goal {target}.{name}.cpu_us_per_request <= {PER_REQUEST_GOAL_US:g}"
            out[key] = _goal(value, PER_REQUEST_GOAL_US)


def overhead_analysis(
    runs: list[dict[str, Any]],
    targets: tuple[str, ...],
    streams: int,
    token_delay_s: float = 0,
    one_token: bool = False,
) -> dict[str, Any]:
    """The overhead section of a result document (see the module doc). `one_token`:
    1-token streams, where CPU per request is the figure and its goals apply.

    With a token delay, `lateness` = inter-event gap minus the delay: how late events
    arrive relative to the worker's schedule, a stamp-free latency figure."""
    out: dict[str, Any] = {}
    for t in targets:
        _per_target(out, runs, t, token_delay_s)
    _added_latency(out, targets)
    _edge_capacity(out, runs, streams)
    cpu = cpu_by_target(runs, targets)
    _peers(out, runs, cpu)
    if one_token:
        _per_request_goals(out, cpu)
    if cpu:
        out["cpu"] = cpu
    return out
