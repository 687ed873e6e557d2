"""The worker's command line: what runs by default, and the names of its flags."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from model_service.__main__ import run
from model_service.config import WorkerConfig, build_parser, config_from_args

ROOT = Path(__file__).resolve().parents[2]


async def loop_type() -> type:
    return type(asyncio.get_running_loop())


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", uvloop.Loop), ("uvloop", uvloop.Loop), ("asyncio", asyncio.SelectorEventLoop)],
)
def test_loop_choice(choice: str, expected: type) -> None:
    seen: list[type] = []

    async def main() -> None:
        seen.append(await loop_type())

    run(main(), choice)
    assert issubclass(seen[0], expected)


def parse(*argv: str) -> WorkerConfig:
    return config_from_args(build_parser().parse_args(argv))


def test_real_engine_by_default_sim_only_when_asked() -> None:
    assert parse().engine.engine == "vllm"
    assert parse("--engine", "sim").engine.engine == "sim"


def test_a_bare_worker_tries_vllm_and_says_it_needs_a_model() -> None:
    """Regression: `python -m model_service` used to run the simulated engine silently."""
    out = subprocess.run(
        [sys.executable, "-m", "model_service", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert "--model must be a model directory" in out.stderr


def test_default_detach_grace_is_named_as_a_default() -> None:
    assert parse("--default-detach-grace", "2.5").replay.default_detach_grace_s == 2.5
    with pytest.raises(SystemExit):  # the old name: the edge has --openai-detach-grace
        parse("--detach-grace", "1")


def test_access_log_follows_the_log_format_unless_told() -> None:
    assert parse().access_log is False
    assert parse("--log-format", "json").access_log is True
    assert parse("--log-format", "json", "--no-access-log").access_log is False
    assert parse("--access-log").access_log is True
