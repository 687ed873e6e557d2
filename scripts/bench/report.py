"""Result files: a JSON document (everything) and a markdown table (the headline figures).

The JSON document is `{"meta", "mode", "runs": [summary, ...], "comparison"?, "overhead"?,
"processes"?}`; `stats.summarize` makes each run's summary.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem_gib = round(pages / 2**30, 1)
    except (ValueError, OSError):
        pass
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "os": platform.platform(),
    }


def meta() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "time_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m scripts.bench " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": machine(),
    }


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{digits}f}".rstrip("0").rstrip(".")
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}"
    return str(v)


def _dist_rows(runs: list[dict], key: str, title: str) -> list[tuple[str, list[Any]]]:
    if not any(r[key].get("n") for r in runs):
        return []
    return [(f"{title} {p} (ms)", [r[key].get(p) for r in runs]) for p in ("p50", "p90", "p99")]


def run_table(runs: list[dict]) -> str:
    """Metrics as rows, runs as columns."""
    rows: list[tuple[str, list[Any]]] = [
        (
            "requests ok / errors",
            [f"{r['requests']['ok']} / {r['requests']['errors']}" for r in runs],
        ),
        ("tokens/s", [r["tokens_per_s"] for r in runs]),
        ("steady tokens/s", [r["steady_tokens_per_s"] for r in runs]),
        ("requests/s", [r["requests_per_s"] for r in runs]),
    ]
    rows += _dist_rows(runs, "ttft_ms", "TTFT")
    rows += _dist_rows(runs, "itl_ms", "ITL")
    rows += _dist_rows(runs, "e2e_ms", "E2E")
    rows += _dist_rows(runs, "stamp_latency_ms", "worker→client")
    if any(r.get("stamp_latency_all_open_ms", {}).get("n") for r in runs):
        rows += _dist_rows(runs, "stamp_latency_all_open_ms", "worker→client, all open")
    rows += [
        ("tokens/request (p50)", [r["tokens_per_request"].get("p50") for r in runs]),
        ("prefix-cache hit rate", [r.get("prefix_cache", {}).get("hit_rate") for r in runs]),
        ("tokens/event", [r["tokens_per_event"] for r in runs]),
        ("rx bytes/token", [r["wire"]["rx_bytes_per_token"] for r in runs]),
        ("payload bytes/token", [r["wire"]["payload_bytes_per_token"] for r in runs]),
        ("harness CPU %", [r["harness"]["cpu_pct"] for r in runs]),
    ]
    errors = sorted({k for r in runs for k in r["errors_by_kind"]})
    rows += [(f"errors: {k}", [r["errors_by_kind"].get(k, 0) for r in runs]) for k in errors]
    head = "| metric | " + " | ".join(r["label"] for r in runs) + " |"
    sep = "| --- |" + " ---: |" * len(runs)
    body = ["| " + name + " | " + " | ".join(_fmt(v) for v in vals) + " |" for name, vals in rows]
    return "\n".join([head, sep, *body])


def kv_table(title: str, values: dict[str, Any]) -> str:
    lines = [f"| {title} | value |", "| --- | ---: |"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in values.items() if not isinstance(v, dict | list)]
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    m = doc["meta"]
    mach = m["machine"]
    parts = [
        f"# Benchmark: {doc['mode']}",
        "",
        f"`{m['command']}`  ",
        f"{m['time_utc']}, commit {m['commit'] or '?'}, {mach['cores']} cores "
        f"({mach['cpu'] or 'unknown CPU'}), {mach['mem_gib']} GiB",
        "",
        run_table(doc["runs"]),
    ]
    for key, title in (("overhead", "overhead"), ("comparison", "comparison"),
                       ("routing", "routing")):  # fmt: skip
        if doc.get(key):
            parts += ["", kv_table(title, doc[key])]
    if (doc.get("overhead") or {}).get("cpu"):
        parts += ["", cpu_table(doc["overhead"]["cpu"])]
    if any(run.get("processes") for run in doc["runs"]):
        parts += ["", process_table(doc["runs"])]
    return "\n".join(parts) + "\n"


def cpu_table(cpu: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Overhead mode: CPU of each server process on a target's path (medians over rounds)."""
    lines = [
        "| target | process | CPU % | CPU µs/event | CPU µs/request | requests/s per core |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for target, procs in cpu.items():
        for name, c in procs.items():
            lines.append(
                f"| {target} | {name} | {_fmt(c['cpu_pct'])} | {_fmt(c['cpu_us_per_event'])} | "
                f"{_fmt(c['cpu_us_per_request'])} | {_fmt(c['requests_per_s_per_core'])} |"
            )
    return "\n".join(lines)


def process_table(runs: list[dict]) -> str:
    """CPU and memory of the watched server processes during each run."""
    lines = [
        "| run | process | CPU % | CPU s | RSS start MiB | RSS peak MiB |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        for name, p in (run.get("processes") or {}).items():
            lines.append(
                f"| {run['label']} | {name} | {_fmt(p['cpu_pct'])} | {_fmt(p['cpu_s'])} | "
                f"{_fmt(p['rss_start_mib'])} | {_fmt(p['rss_peak_mib'])} |"
            )
    return "\n".join(lines)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write(doc: dict[str, Any], out_dir: Path, name: str) -> tuple[Path, Path]:
    """Write NAME.json and NAME.md under out_dir; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{name}.json"
    md_path = out_dir / f"{name}.md"
    json_path.write_bytes(orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2))
    md_path.write_text(markdown(doc))
    return json_path, md_path
