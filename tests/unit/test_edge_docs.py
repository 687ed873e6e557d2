"""The edge's documentation stays true to its code: ARCHITECTURE.md's module table lists
every module of `edge/` once, and module docstrings stay a few lines (what, the invariant,
the one non-obvious reason); how the parts fit is ARCHITECTURE.md's to say."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "edge"
MAX_DOC_LINES = 6
# Being covered by scripted unit tests in another change right now: trimmed after it lands.
LONG_DOCS_FOR_NOW = {"upstream/failover.py", "stream/response.py"}


def modules() -> list[str]:
    return sorted(
        p.relative_to(EDGE).as_posix() for p in EDGE.rglob("*.py") if p.name != "__init__.py"
    )


def table_modules(text: str) -> list[str]:
    """The modules the edge section's table names in its first column, in order."""
    section = text[text.index("## The edge (`edge/`)") :]
    found = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            found += re.findall(r"`([\w/]+\.py)`", first)
    return found


def test_the_module_table_lists_every_edge_module_once() -> None:
    listed = table_modules((ROOT / "ARCHITECTURE.md").read_text())
    assert sorted(listed) == modules()


def test_the_table_check_can_fail() -> None:
    text = "## The edge (`edge/`)\n| module | concept |\n| `app.py`, `app.py` | twice |\n"
    assert table_modules(text) == ["app.py", "app.py"]
    assert sorted(table_modules(text)) != modules()


def test_module_docstrings_are_a_few_lines() -> None:
    long = {}
    for name in modules():
        doc = ast.get_docstring(ast.parse((EDGE / name).read_text()), clean=False) or ""
        if len(doc.splitlines()) > MAX_DOC_LINES and name not in LONG_DOCS_FOR_NOW:
            long[name] = len(doc.splitlines())
    assert long == {}
