"""Options declared once: a dataclass field carries its flag, default and help.

`option(default, "--flag", "help", **argparse_kwargs)` is the field; `add_section` adds a
dataclass's flagged fields to a parser (dest `<section>.<field>`) and `section_from`
builds the dataclass back from the parsed values, so no flag is written twice. The edge,
the worker and the scripts all declare their options this way.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from typing import Any, TypeVar

T = TypeVar("T")


def option(default: Any, flag: str, help: str, **argparse_kwargs: Any) -> Any:
    """A config field with its command-line flag (`argparse_kwargs`: type, choices, action)."""
    meta = {"flag": flag, "help": help, **argparse_kwargs}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flagged(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of `cls` that have a flag."""
    return [f for f in dataclasses.fields(cls) if "flag" in f.metadata]


def add_section(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, cls: type
) -> None:
    """Add `cls`'s flagged fields to `parser`, each with dest `<name>.<field>`.

    A field's type is its default's unless the declaration says otherwise; a field
    whose default is None needs an explicit `type`.
    """
    defaults = cls()
    for f in flagged(cls):
        meta = dict(f.metadata)
        flag, help_ = meta.pop("flag"), meta.pop("help")
        default = getattr(defaults, f.name)
        if (
            "type" not in meta
            and "action" not in meta
            and default is not None
            and not isinstance(default, str)
        ):
            meta["type"] = type(default)
        if meta.get("action") == "append":
            default = []
        flags = flag if isinstance(flag, tuple) else (flag,)
        if meta.get("action") not in ("store_true", "store_false", "count", "version"):
            if not isinstance(meta.get("action"), type) and "choices" not in meta:
                meta.setdefault("metavar", flags[0].lstrip("-").upper().replace("-", "_"))
        parser.add_argument(*flags, dest=f"{name}.{f.name}", default=default, help=help_, **meta)


def section_from(values: dict[str, Any] | argparse.Namespace, name: str, cls: type[T]) -> T:
    """`cls` built from the parsed values of its flagged fields (the rest: defaults)."""
    raw = vars(values) if isinstance(values, argparse.Namespace) else values
    return cls(**{f.name: raw[f"{name}.{f.name}"] for f in flagged(cls)})
