"""The worker's command line: what runs by default, and the names of its flags."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from model_service.__main__ import run


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
