"""generated/ must be exactly what protoc makes from protos/ (never hand-edited)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_matches_protos(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "protos").glob("*.proto"))
    (tmp_path / "generated").mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Igenerated=protos",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            # The contract with its comments, for reflection (`grpcurl describe`).
            "--include_source_info",
            f"--descriptor_set_out={tmp_path}/generated/contract.binpb",
            *protos,
        ],
        cwd=ROOT,
        check=True,
    )
    made = sorted((tmp_path / "generated").iterdir())
    assert made, "protoc produced nothing"
    for f in made:
        committed = ROOT / "generated" / f.name
        assert committed.exists(), f"generated/{f.name} is missing: run `make protos`"
        assert committed.read_bytes() == f.read_bytes(), (
            f"generated/{f.name} is stale: run `make protos`"
        )


def test_every_proto_element_is_commented() -> None:
    """The contract is what internal callers read first: each declaration has a comment."""
    for proto in (ROOT / "protos").glob("*.proto"):
        lines = proto.read_text().splitlines()
        for i, line in enumerate(lines):
            s = line.strip()
            decl = s.startswith(("service ", "rpc ", "message ", "enum ")) or (
                s.endswith(";")
                and "=" in s
                and not s.startswith(("syntax", "package", "option", "//"))
            )
            if decl:
                assert lines[i - 1].strip().startswith("//"), (
                    f"{proto.name}:{i + 1} lacks a comment: {s}"
                )
