"""What a generation is given by its owner (`Runtime`) and reports back (`Hooks`): all it
knows of the worker, so that it imports neither the core nor the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from model_service.engines.base import Engine
from model_service.errors import SluiceError

if TYPE_CHECKING:
    from model_service.generation.run import Generation


class Hooks(Protocol):
    """What a generation reports to its owner (the worker core)."""

    def finished(self, gen: Generation) -> None:
        """Called once, as the generation ends (any reason)."""

    def engine_died(self, err: SluiceError) -> None:
        """The engine failed for good (EngineDead)."""

    def detach_expired(self, wasted_tokens: int) -> None:
        """A detached generation was aborted after its grace."""


class Observer(Protocol):
    def observe(self, value: float) -> None: ...


class Ledger(Protocol):
    """Where the sizes of running generations' logs add up (the replay store, for its cap)."""

    live_bytes: int


@dataclass(frozen=True, slots=True)
class Runtime:
    """What all generations of one worker share."""

    engine: Engine
    hooks: Hooks
    itl: Observer  # inter-token gaps, seconds (lock-free: observed per token chunk)
    ledger: Ledger
