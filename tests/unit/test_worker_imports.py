"""Imports inside the worker run one way, room by room (ARCHITECTURE.md, the worker):

    types, errors, config -> engines -> intake -> constraints -> generation -> obs -> core
    -> rpc -> server

A module may import its own room and the rooms before it, never one after it; the client
imports nothing of the worker, and engines never see protobuf. Read with `ast`, so imports
under `if TYPE_CHECKING:` count too (they are how the old core <-> generation <-> metrics
knot was tied).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "model_service"
ORDER = (
    "foundation", "engines", "intake", "constraints", "generation", "obs", "core", "rpc",
    "bootstrap",
)  # fmt: skip
SUBPACKAGES = {"engines", "intake", "constraints", "generation", "obs", "rpc"}
TOP_LEVEL = {
    "__init__": "foundation",
    "types": "foundation",
    "errors": "foundation",
    "config": "foundation",
    "core": "core",
    "server": "bootstrap",
    "__main__": "bootstrap",
    "client": "client",  # for internal services: stands alone
}


def room(module: str) -> str | None:
    """The room of a dotted `model_service` module name (None: a module in no room)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "foundation"  # the package itself
    if parts[1] in SUBPACKAGES:
        return parts[1]
    return TOP_LEVEL.get(parts[1])


def allowed(importer: str, imported: str) -> bool:
    if importer == "client":
        return False
    if imported == "client":
        return True
    return ORDER.index(imported) <= ORDER.index(importer)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from model_service import core` imports the module model_service.core
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def module_name(package: Path, path: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(package: Path) -> list[str]:
    """Each import that runs the wrong way, each module in no room, each engine module
    importing protobuf, as `file: message`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        mine = room(module_name(package, path))
        if mine is None:
            found.append(f"{where}: in no room (add it to TOP_LEVEL or a subpackage)")
            continue
        imports = imported_modules(path)
        if mine == "engines" and "generated" in {i.split(".")[0] for i in imports}:
            found.append(f"{where}: engines never see protobuf, but it imports generated")
        wrong = {
            name: theirs
            for name in imports
            if name.split(".")[0] == package.name
            and (theirs := room(name)) is not None
            and not allowed(mine, theirs)
        }
        for name in sorted(wrong):  # `from m import A`: m, not m.A as well
            if not any(name.startswith(f"{other}.") for other in wrong):
                found.append(f"{where} ({mine}) imports {name} ({wrong[name]})")
    return found


def test_imports_run_one_way() -> None:
    assert violations(PACKAGE) == []


def test_every_room_has_modules() -> None:
    """The rule names real rooms: a renamed or emptied one fails here, not silently."""
    rooms = {room(module_name(PACKAGE, p)) for p in PACKAGE.rglob("*.py")}
    assert rooms == {*ORDER, "client"}


def plant(package: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(package).parents:
            (package / parent / "__init__.py").touch()
        path.write_text(text)


def test_a_wrong_way_import_is_caught(tmp_path: Path) -> None:
    package = tmp_path / "model_service"
    plant(
        package,
        {
            "types.py": "",
            "core.py": "from model_service.rpc.stream import GenerateStream\n",
            "generation/run.py": (
                "from typing import TYPE_CHECKING\n"
                "from model_service.intake.admission import Ticket\n"  # the right way
                "if TYPE_CHECKING:\n"
                "    from model_service.core import WorkerCore\n"
            ),
            "intake/admission.py": "from model_service import obs\n",
            "engines/sim/engine.py": "from generated import sluice_pb2 as pb\n",
            "rpc/stream.py": "import model_service.core\n",  # the right way
            "client.py": "from model_service.types import ModelInfo\n",
            "stray.py": "",
        },
    )
    assert violations(package) == [
        "model_service/client.py (client) imports model_service.types (foundation)",
        "model_service/core.py (core) imports model_service.rpc.stream (rpc)",
        "model_service/engines/sim/engine.py: engines never see protobuf, but it imports generated",
        "model_service/generation/run.py (generation) imports model_service.core (core)",
        "model_service/intake/admission.py (intake) imports model_service.obs (obs)",
        "model_service/stray.py: in no room (add it to TOP_LEVEL or a subpackage)",
    ]
