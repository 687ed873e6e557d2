"""Imports inside the worker run one way: generation and metrics know nothing of the core,
the core nothing of the RPC layer, and nothing imports the bootstrap.

Read with `ast`, so imports under `if TYPE_CHECKING:` count too (they are how the old
core <-> generation <-> metrics knot was tied).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "model_service"
RPC = {"model_service.stream", "model_service.servicer", "model_service.reflection"}
BOOTSTRAP = {"model_service.server", "model_service.__main__"}
FORBIDDEN = {
    "generation": {"model_service.core", "model_service.metrics"} | RPC | BOOTSTRAP,
    "metrics": {"model_service.core", "model_service.generation"} | RPC | BOOTSTRAP,
    "core": RPC | BOOTSTRAP,
    "stream": {"model_service.servicer"} | BOOTSTRAP,
    "servicer": BOOTSTRAP,
    "engines/sim": {"model_service.core", "model_service.generation"} | RPC | BOOTSTRAP,
    "engines/sim_cache": {"model_service.core", "model_service.generation"} | RPC | BOOTSTRAP,
    "load": RPC | BOOTSTRAP,
}


def imported_modules(path: Path) -> set[str]:
    """Every model_service module `path` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from model_service import core` imports the module model_service.core
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("model_service.")}


@pytest.mark.parametrize("module", sorted(FORBIDDEN))
def test_imports_run_one_way(module: str) -> None:
    wrong = imported_modules(PACKAGE / f"{module}.py") & FORBIDDEN[module]
    assert not wrong, f"model_service/{module}.py imports {sorted(wrong)}"


def test_the_check_sees_type_checking_imports(tmp_path: Path) -> None:
    src = tmp_path / "knot.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from model_service.core import WorkerCore\n"
        "from model_service import metrics\n"
    )
    assert {"model_service.core", "model_service.metrics"} <= imported_modules(src)
