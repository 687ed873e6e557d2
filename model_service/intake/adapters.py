"""Which LoRA adapters the worker holds beside its base model: a start's `model` resolved
to one, the checks of a load (name, PEFT directory, rank, slots) and which adapters have
generations now. The registry decides; the engine only loads what it accepted
(`WorkerCore.load_adapter`). An adapter unloaded while generations use it leaves the
registry at once (new starts get NOT_FOUND) and the engine after its last generation."""

from __future__ import annotations

import json
import os
import re
from collections import Counter

from model_service.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NoAdapterSlot,
    NotFound,
)
from model_service.types import Adapter

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20


def parse_flag(entry: str) -> tuple[str, str]:
    """`--lora NAME=PATH` as (name, absolute path). Raises InvalidArgument."""
    name, sep, path = entry.partition("=")
    if not sep or not name or not path:
        raise InvalidArgument("--lora", f"{entry!r} is not NAME=PATH")
    return name, os.path.abspath(path)


def read_rank(path: str) -> int:
    """The LoRA rank in a PEFT directory's `adapter_config.json`. Raises InvalidArgument
    (`path`) when the directory holds no LoRA adapter."""
    if not os.path.isabs(path):
        raise InvalidArgument("path", f"{path!r} is not an absolute path")
    config = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config):
        raise InvalidArgument("path", f"{path!r} holds no adapter ({CONFIG_FILE} not found)")
    try:
        if os.path.getsize(config) > MAX_CONFIG_BYTES:
            raise ValueError("larger than 1 MiB")
        with open(config, encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise InvalidArgument("path", f"{config} is not readable JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("peft_type", "LORA") != "LORA":
        raise InvalidArgument("path", f"{config} does not describe a LoRA adapter")
    rank = body.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidArgument("path", f"{config} has no LoRA rank `r`")
    return rank


class Adapters:
    """The registry (module docstring). `version` counts its changes (load pushes carry it
    so routers list the models again)."""

    def __init__(self, base: str, slots: int, max_rank: int) -> None:
        self.base = base
        self.slots = slots
        self.max_rank = max_rank
        self.version = 0
        self._by_name: dict[str, Adapter] = {}
        self._active: Counter[Adapter] = Counter()  # generations admitted, per adapter
        self._next_id = 1

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, model: str) -> Adapter | None:
        """The adapter a start's `model` names (None: the base model or an unknown name,
        which validation refuses)."""
        return self._by_name.get(model) if model else None

    def active(self) -> tuple[str, ...]:
        """Names of the registered adapters with generations now, sorted."""
        held = self._by_name
        return tuple(sorted(a.name for a in self._active if held.get(a.name) is a))

    def prepare(self, name: str, path: str) -> Adapter | None:
        """Check a load; the adapter to hand the engine, or None when it is loaded already
        from that path. Raises InvalidArgument, AlreadyExists, NoAdapterSlot, FailedPrecondition."""
        if self.slots <= 0:
            raise FailedPrecondition("this worker serves no adapters (start it with --max-loras)")
        if not NAME.fullmatch(name):
            raise InvalidArgument("name", "must be 1 to 64 letters, digits or ._-")
        if name == self.base:
            raise AlreadyExists(f"{name!r} is the base model's name", field="name")
        path = os.path.normpath(path) if path else ""
        if not path:
            raise InvalidArgument("path", "is required")
        held = self._by_name.get(name)
        if held is not None:
            if held.path == path:
                return None
            raise AlreadyExists(
                f"adapter {name!r} is loaded from {held.path!r}; unload it first", field="name"
            )
        rank = read_rank(path)  # the adapter's own faults first, then this worker's room
        if rank > self.max_rank:
            raise InvalidArgument(
                "path", f"adapter rank {rank} is above the worker's --max-lora-rank {self.max_rank}"
            )
        if len(self._by_name) >= self.slots:
            names = ", ".join(sorted(self._by_name))
            raise NoAdapterSlot(
                f"every adapter slot is taken ({len(self._by_name)} of {self.slots}: {names}); "
                "unload one first",
                field="name",
            )
        adapter = Adapter(name, path, self._next_id, rank)
        self._next_id += 1
        return adapter

    def add(self, adapter: Adapter) -> None:
        """The engine loaded it (a name loaded meanwhile by another call: the first wins)."""
        if adapter.name in self._by_name:
            raise AlreadyExists(f"adapter {adapter.name!r} was loaded meanwhile", field="name")
        self._by_name[adapter.name] = adapter
        self.version += 1

    def remove(self, name: str) -> Adapter | None:
        """Unregister an adapter; returns it when the engine may drop it now (None: its
        generations still run, `release` returns it after the last). Raises NotFound."""
        adapter = self._by_name.pop(name, None)
        if adapter is None:
            raise NotFound(f"adapter {name!r} is not loaded", field="name")
        self.version += 1
        return None if self._active[adapter] else adapter

    def acquire(self, adapter: Adapter) -> None:
        """A generation with it is admitted (a start resolved before an unload included)."""
        self._active[adapter] += 1

    def release(self, adapter: Adapter) -> Adapter | None:
        """A generation with it ended; returns it when it was unloaded meanwhile and this
        was its last generation (the engine may drop it now)."""
        self._active[adapter] -= 1
        if self._active[adapter] > 0:
            return None
        del self._active[adapter]
        return None if self._by_name.get(adapter.name) is adapter else adapter
