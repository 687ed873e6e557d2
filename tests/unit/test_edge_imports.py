"""The edge's import rules: it shares only `generated/` and `sluice_common/` with the
worker (test_shared_imports.py), and its layers import one way (api -> stream -> upstream;
api -> release -> routing -> upstream; upstream depends on neither routing nor release;
security and obs depend on none of them)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ("vllm", "torch", "model_service")
EDGE = Path(__file__).resolve().parents[2] / "edge"
# What each part of the edge may import from the edge. The bootstrap (`edge.app`,
# `edge.__main__`) wires everything and may import anything.
ALLOWED = {
    "edge.errors": set(),
    "edge.config": set(),
    "edge.obs": {"edge.obs"},
    "edge.store": {"edge.store", "edge.obs", "edge.errors", "edge.config"},
    "edge.security": {"edge.security", "edge.store", "edge.obs", "edge.errors", "edge.config"},
    "edge.upstream": {"edge.upstream", "edge.obs", "edge.errors", "edge.config"},
    "edge.routing": {
        "edge.routing", "edge.upstream", "edge.store", "edge.obs", "edge.errors", "edge.config",
    },
    "edge.release": {
        "edge.release", "edge.routing", "edge.upstream", "edge.store", "edge.obs", "edge.errors",
        "edge.config",
    },
    "edge.stream": {"edge.stream", "edge.upstream", "edge.obs", "edge.errors", "edge.config"},
    "edge.api": {
        "edge.api", "edge.stream", "edge.release", "edge.routing", "edge.upstream", "edge.store",
        "edge.obs", "edge.errors", "edge.config",
    },
}  # fmt: skip
BOOTSTRAP = {"edge.app", "edge.__main__", "edge"}


def module_name(path: Path) -> str:
    rel = path.relative_to(EDGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def edge_imports(path: Path) -> set[str]:
    """Every `edge...` module a file imports (at any depth: TYPE_CHECKING blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "edge"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "edge":
                names = {f"{node.module}.{a.name}" for a in node.names}
                found |= {node.module} | names
    return found


def part_of(module: str) -> str | None:
    """The layer (or shared module) a module belongs to, longest match."""
    best = None
    for part in (*ALLOWED, *BOOTSTRAP):
        if (module == part or module.startswith(part + ".")) and len(part) > len(best or ""):
            best = part
    return best


def violations() -> list[str]:
    out = []
    for path in sorted(EDGE.rglob("*.py")):
        me = module_name(path)
        mine = part_of(me)
        if mine in BOOTSTRAP or mine is None:
            continue
        for target in sorted(edge_imports(path)):
            theirs = part_of(target)
            if theirs in (None, "edge"):  # `from edge import x`: judged by x
                continue
            if theirs not in ALLOWED[mine]:
                out.append(f"{me} imports {target} ({mine} may not depend on {theirs})")
    return out


def test_layers_import_one_way() -> None:
    assert violations() == []


def test_every_module_is_in_a_layer() -> None:
    loose = [module_name(p) for p in EDGE.rglob("*.py") if part_of(module_name(p)) is None]
    assert loose == []


WRONG_WAY = [
    ("upstream", "from edge.stream.response import Job\n", "edge.stream.response", "edge.stream"),
    (
        "upstream",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from edge.routing.registry import PoolRegistry\n",
        "edge.routing.registry",
        "edge.routing",
    ),
    ("upstream", "import edge.release.canary\n", "edge.release.canary", "edge.release"),
    ("routing", "from edge.release.rollouts import Rollouts\n", "edge.release.rollouts",
     "edge.release"),
    ("release", "from edge.api.state import EdgeState\n", "edge.api.state", "edge.api"),
    ("stream", "from edge.routing.pinning import Pinning\n", "edge.routing.pinning",
     "edge.routing"),
]  # fmt: skip


@pytest.mark.parametrize(("room", "code", "target", "layer"), WRONG_WAY)
def test_a_wrong_way_import_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: str, code: str, target: str, layer: str
) -> None:
    """The check itself can fail: a planted import against the direction is reported
    (in a TYPE_CHECKING block too)."""
    fake = tmp_path / "edge"
    (fake / room).mkdir(parents=True)
    (fake / room / "bad.py").write_text(code)
    monkeypatch.setattr(sys.modules[__name__], "EDGE", fake)
    found = violations()
    me = f"edge.{room}"
    assert found and all(v.startswith(f"{me}.bad imports ") for v in found)
    assert f"{me}.bad imports {target} ({me} may not depend on {layer})" in found


def test_no_module_is_over_400_lines() -> None:
    long = {
        module_name(p): n
        for p in EDGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


def test_edge_imports_no_engine_or_worker_code() -> None:
    code = (
        "import sys, edge.__main__, edge.app;"
        f"print([m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
