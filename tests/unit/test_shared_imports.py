"""What the worker and the edge share: `generated/` and `sluice_common/`, nothing else.

Each side imports its own package plus those two; `sluice_common` imports neither side
(nor Starlette, vLLM or torch, which only one side has; it may read `generated/`); and
whatever the two import of ours is packaged (pyproject's package list, the Dockerfile's COPY lines).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Our top-level packages: what a first-party import can name.
OURS = {"generated", "sluice_common", "model_service", "edge", "scripts", "tests"}
SHARED = {"generated", "sluice_common"}
MAY_IMPORT = {
    "edge": {"edge"} | SHARED,
    "model_service": {"model_service"} | SHARED,
    "sluice_common": SHARED,  # the contract's constants read generated/
}
# Each side's own heavy dependencies: the shared code may load none of them.
ONE_SIDE_ONLY = ("starlette", "uvicorn", "vllm", "torch", "transformers")


def top_level_imports(path: Path) -> set[str]:
    """The top-level package of every absolute import in `path` (at any depth)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def wrong_imports(root: Path = ROOT) -> list[str]:
    out = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((root / package).rglob("*.py")):
            for name in sorted(top_level_imports(path) & OURS - allowed):
                out.append(f"{path.relative_to(root)} imports {name}")
    return out


def test_the_sides_share_only_generated_and_sluice_common() -> None:
    assert wrong_imports() == []


def test_a_worker_import_in_the_edge_is_caught(tmp_path: Path) -> None:
    for package in MAY_IMPORT:
        (tmp_path / package).mkdir()
    (tmp_path / "edge" / "bad.py").write_text("from model_service.obs.logs import trace_id\n")
    (tmp_path / "sluice_common" / "bad.py").write_text("import edge.obs.tracing\n")
    assert wrong_imports(tmp_path) == [
        "edge/bad.py imports model_service",
        "sluice_common/bad.py imports edge",
    ]


def test_shared_code_loads_nothing_of_one_side_or_the_otel_sdk() -> None:
    """Tracing off costs no import: the SDK is loaded inside the functions."""
    modules = sorted(p.stem for p in (ROOT / "sluice_common").glob("*.py"))
    code = (
        "import sys;"
        + "".join(f"import sluice_common.{m};" for m in modules)
        + "print(sorted({m.split('.')[0] for m in sys.modules} & "
        + f"{set((*ONE_SIDE_ONLY, 'opentelemetry'))!r}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_every_package_the_sides_import_is_packaged() -> None:
    needed = {"edge", "model_service"}
    for package in ("edge", "model_service"):
        for path in (ROOT / package).rglob("*.py"):
            needed |= top_level_imports(path) & SHARED
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert needed <= {pattern.rstrip("*") for pattern in include}
    dockerfile = (ROOT / "scripts" / "deploy" / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, re.MULTILINE))
    assert needed <= copied
