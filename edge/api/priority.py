"""A request's priority class (high, normal, low) and tenant, as the worker's admission queue
takes them: `X-Sluice-Priority`, else `service_tier`, else the key's class, which is also
its ceiling (a header above it: 403; a tier above it: served at the key's class). The
tenant is the key's (`--key-tenant NAME=TENANT`), else the API key's name (one tenant
with authentication off)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from edge.errors import ApiError, invalid
from generated import sluice_pb2 as pb

HEADER = "x-sluice-priority"
Class: TypeAlias = pb.Priority
CLASSES: dict[str, Class] = {
    "high": pb.PRIORITY_HIGH,
    "normal": pb.PRIORITY_NORMAL,
    "low": pb.PRIORITY_LOW,
}
NAMES: dict[Class, str] = {v: k for k, v in CLASSES.items()}
_RANK: dict[Class, int] = {pb.PRIORITY_HIGH: 0, pb.PRIORITY_NORMAL: 1, pb.PRIORITY_LOW: 2}
# OpenAI's service tiers; None: the key's own class.
SERVICE_TIERS: dict[str, Class | None] = {
    "auto": None,
    "default": None,
    "flex": pb.PRIORITY_LOW,
    "priority": pb.PRIORITY_HIGH,
    "scale": pb.PRIORITY_HIGH,
}


def key_classes(entries: Iterable[str]) -> dict[str, Class]:
    """`--key-priority NAME=CLASS` entries (checked by the config) as a map."""
    pairs = (entry.partition("=") for entry in entries)
    return {name: CLASSES[cls.lower()] for name, _, cls in pairs}


def check_tier(value: str | None) -> str | None:
    """A request's `service_tier`, validated (400 naming it)."""
    if value is not None and value not in SERVICE_TIERS:
        allowed = ", ".join(sorted(SERVICE_TIERS))
        raise invalid("service_tier", f"'service_tier' must be one of {allowed}")
    return value


def resolve(header: str | None, tier: str | None, key_class: Class | None) -> Class:
    """The class to send. `key_class`: the caller's key class, None with auth off."""
    default = pb.PRIORITY_NORMAL if key_class is None else key_class
    ceiling = pb.PRIORITY_HIGH if key_class is None else key_class
    if header is not None:
        asked = CLASSES.get(header.strip().lower())
        if asked is None:
            raise invalid("X-Sluice-Priority", "X-Sluice-Priority must be high, normal or low")
        if _RANK[asked] < _RANK[ceiling]:
            raise ApiError(
                403,
                f"this API key may ask for priority {NAMES[ceiling]} at most",
                type="permission_error",
                param="X-Sluice-Priority",
                code="priority_not_allowed",
            )
        return asked
    if tier is not None:
        asked = SERVICE_TIERS[tier]
        if asked is not None:
            return asked if _RANK[asked] >= _RANK[ceiling] else ceiling
    return default


@dataclass(frozen=True, slots=True)
class Priorities:
    """The keys' classes, and whether keys are in use at all (auth on)."""

    keys: Mapping[str, Class] = field(default_factory=dict)
    auth: bool = False
    tenants: Mapping[str, str] = field(default_factory=dict)  # key name -> tenant

    def of(self, header: str | None, tier: str | None, caller: str | None) -> tuple[Class, str]:
        """(class, tenant) for a request from `caller` (the key's name)."""
        if not self.auth:
            return resolve(header, tier, None), ""
        name = caller or ""
        klass = resolve(header, tier, self.keys.get(name, pb.PRIORITY_NORMAL))
        return klass, self.tenants.get(name, name)
