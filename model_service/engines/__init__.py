"""Engine implementations, loaded by name so that `sim` never imports vLLM or torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model_service.config import EngineConfig
    from model_service.engines.base import Engine

ENGINES: dict[str, str] = {
    "sim": "model_service.engines.sim.engine:SimEngine",
    "vllm": "model_service.engines.vllm.engine:VllmEngine",
    "triton": "model_service.engines.triton.engine:TritonEngine",
}


def load_engine(config: EngineConfig) -> Engine:
    """Instantiate the engine named by `config.engine`."""
    try:
        target = ENGINES[config.engine]
    except KeyError:
        raise ValueError(
            f"unknown engine {config.engine!r}; choose one of {', '.join(sorted(ENGINES))}"
        ) from None
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    engine: Engine = cls(config)
    return engine
