"""CLI: `python -m model_service --engine sim --port 50051` (console script `sluice-worker`)."""

from __future__ import annotations

import asyncio
import logging
import sys

from model_service.config import build_parser, config_from_args
from model_service.logs import setup_logging
from model_service.server import serve


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    setup_logging(args.log_level, args.log_format)
    try:
        asyncio.run(serve(config, args.port_file))
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
