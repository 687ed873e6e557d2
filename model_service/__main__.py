"""CLI: `python -m model_service --model DIR --port 50051` (console script `sluice-worker`):
the vLLM engine; `--engine sim` runs the simulated one."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from model_service.config import build_parser, config_from_args
from model_service.obs.logs import setup_logging
from model_service.server import serve


def run(main: Coroutine[Any, Any, None], loop: str) -> None:
    """Run `main` on the chosen event loop ("auto": uvloop when it is installed)."""
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def main(argv: list[str] | None = None) -> int:
    config = config_from_args(build_parser().parse_args(argv))
    setup_logging(config.log_level, config.log_format)
    try:
        run(serve(config, config.server.port_file), config.loop)
    except KeyboardInterrupt:
        return 130
    except (RuntimeError, ValueError, OSError) as exc:
        logging.getLogger("sluice.worker").error("worker failed: %s", exc)
        return 1
    return 0


# The guard matters: vLLM's AsyncLLM spawns its engine core process, which re-imports
# the main module.
if __name__ == "__main__":
    sys.exit(main())
