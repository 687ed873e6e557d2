"""`python -m scripts.bench`: parse the CLI, pick the event loop, run the mode."""

from __future__ import annotations

import sys

from scripts.bench import decision, modes, routing, selftest
from scripts.bench.config import build_parser, config_from_args
from scripts.bench.fanout import use_uvloop


def main(argv: list[str] | None = None) -> int:
    cfg = config_from_args(build_parser().parse_args(argv))
    use_uvloop()
    if cfg.mode == "selftest":
        selftest.run(cfg.selftest_events)
        return 0
    if cfg.mode == "compare":
        if len(cfg.compare.targets) != 2:
            raise SystemExit("compare mode needs --compare A B")
        doc = modes.compare_mode(cfg)
    elif cfg.mode == "overhead":
        doc = modes.overhead_mode(cfg)
    elif cfg.mode == "decision":
        doc = decision.decision_mode(cfg)
    elif cfg.mode == "routing":
        doc = routing.routing_mode(cfg)
    else:
        doc = modes.run_mode(cfg)
    runs = doc["runs"]
    return 0 if all(r["requests"]["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
