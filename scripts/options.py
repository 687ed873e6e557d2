"""The options several scripts share, each declared once (`sluice_common.options`).

Each function returns one `option(...)` field: the flag, its type and its help are
written here; the default is the caller's where scripts differ (worker_cpu measures 15 s
per mode, priority_bench 20 s per phase), and a caller may say what the value counts in
its help. Functions rather than shared fields: a dataclass field belongs to one class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice_common.options import option

RESULTS = Path(__file__).resolve().parent / "results"
ADMIN_KEY_ENV = "SLUICE_ADMIN_KEY"
DEFAULT_STEPS = "1,5,25,50,100"


def results_dir() -> Any:
    """`--out DIR`: where a benchmark writes its results (scripts/results)."""
    return option(RESULTS, "--out", "result directory", type=Path)


def concurrency(default: int, help: str = "streams in flight") -> Any:
    return option(default, "--concurrency", help)


def duration(default: float, help: str = "measured seconds per run") -> Any:
    return option(default, "--duration", help)


def warmup_s(default: float, help: str = "seconds of load before measuring") -> Any:
    return option(default, "--warmup", help)


def rounds(default: int, help: str = "rounds, alternating what is compared") -> Any:
    return option(default, "--rounds", help)


def seed(default: int) -> Any:
    return option(default, "--seed", "random seed (prompts, arrivals)")


def tokens(default: int, help: str = "max_tokens per request") -> Any:
    return option(default, "--tokens", help)


def token_delay(default: float) -> Any:
    return option(default, "--token-delay", "the sim worker's seconds between tokens")


def worker_args() -> Any:
    """`--worker-arg FLAG` (repeat): passed on to every worker the script starts."""
    return option((), "--worker-arg", "extra worker flag (repeat)", action="append")


def admin_key_file() -> Any:
    """The edge's admin key comes from this file or the environment, never a flag."""
    return option("", "--admin-key-file", f"else ${ADMIN_KEY_ENV}")


# A rollout plan (scripts/rollout.py runs one, scripts/rollout_bench.py measures one).
def steps() -> Any:
    return option(DEFAULT_STEPS, "--steps", "canary %% per step, ending at 100")


def hold(default: float) -> Any:
    return option(default, "--hold", "seconds per step")


def min_samples(default: int) -> Any:
    return option(default, "--min-samples", "canary outcomes to judge")


def percents(steps: str) -> list[float]:
    """`--steps 1,5,25` as the plan's list of canary percentages."""
    return [float(s) for s in steps.split(",") if s.strip()]
