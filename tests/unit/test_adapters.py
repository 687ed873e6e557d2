"""The worker's adapter registry (`model_service/intake/adapters.py`): a load's checks,
slots, and an adapter unloaded while generations use it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from model_service.errors import SluiceError
from model_service.intake.adapters import Adapters, parse_flag, read_rank
from tests.lora import write_sim_adapter


def _code(call: object) -> tuple[str, str]:
    with pytest.raises(SluiceError) as info:
        call()  # type: ignore[operator]
    return info.value.code.name, info.value.field


def test_a_load_is_checked_before_the_engine_sees_it(tmp_path: Path) -> None:
    reg = Adapters("base", 2, 16)
    ok = str(write_sim_adapter(tmp_path / "ok"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "adapter_config.json").write_text("{not json")
    (tmp_path / "prefix").mkdir()
    (tmp_path / "prefix" / "adapter_config.json").write_text('{"peft_type": "PREFIX_TUNING"}')
    got = {
        "bad name": _code(lambda: reg.prepare("a/b", ok)),
        "base name": _code(lambda: reg.prepare("base", ok)),
        "no path": _code(lambda: reg.prepare("a", "")),
        "relative": _code(lambda: reg.prepare("a", "ok")),
        "no config": _code(lambda: reg.prepare("a", str(tmp_path))),
        "junk": _code(lambda: reg.prepare("a", str(tmp_path / "junk"))),
        "not lora": _code(lambda: reg.prepare("a", str(tmp_path / "prefix"))),
        "rank": _code(lambda: reg.prepare("a", str(write_sim_adapter(tmp_path / "r", 32)))),
    }
    invalid_path = ("INVALID_ARGUMENT", "path")
    assert got == {
        "bad name": ("INVALID_ARGUMENT", "name"),
        "base name": ("ALREADY_EXISTS", "name"),
        "no path": invalid_path,
        "relative": invalid_path,
        "no config": invalid_path,
        "junk": invalid_path,
        "not lora": invalid_path,
        "rank": invalid_path,
    }
    assert len(reg) == 0 and reg.version == 0


def test_slots_names_and_the_same_path_again(tmp_path: Path) -> None:
    reg = Adapters("base", 1, 16)
    a, b = str(write_sim_adapter(tmp_path / "a")), str(write_sim_adapter(tmp_path / "b", 4))
    first = reg.prepare("a", a)
    assert first is not None and (first.name, first.path, first.rank) == ("a", a, 8)
    reg.add(first)
    assert reg.prepare("a", a + "/") is None  # loaded from that path already: nothing to do
    assert _code(lambda: reg.prepare("a", b)) == ("ALREADY_EXISTS", "name")
    assert _code(lambda: reg.prepare("b", b)) == ("RESOURCE_EXHAUSTED", "name")
    assert reg.resolve("a") is first and reg.resolve("base") is None and reg.resolve("") is None
    assert _code(lambda: Adapters("base", 0, 16).prepare("a", a))[0] == "FAILED_PRECONDITION"


def test_an_adapter_in_use_leaves_the_engine_after_its_last_generation(tmp_path: Path) -> None:
    reg = Adapters("base", 2, 16)
    adapter = reg.prepare("a", str(write_sim_adapter(tmp_path / "a")))
    assert adapter is not None
    reg.add(adapter)
    reg.acquire(adapter)
    reg.acquire(adapter)
    assert reg.active() == ("a",)
    assert reg.remove("a") is None  # still running: the engine keeps it
    assert reg.resolve("a") is None and reg.active() == () and reg.version == 2
    assert reg.release(adapter) is None
    assert reg.release(adapter) is adapter  # the last one: now the engine drops it
    again = reg.prepare("a", adapter.path)
    assert again is not None and again.id != adapter.id  # a new id for vLLM's cache
    assert _code(lambda: reg.remove("zzz")) == ("NOT_FOUND", "name")
    # A start resolved before an unload and admitted after it: the engine drops the
    # adapter when that generation ends.
    reg.add(again)
    assert reg.remove("a") is again
    reg.acquire(again)
    assert reg.active() == () and reg.release(again) is again


def test_the_lora_flag_and_rank_reader() -> None:
    name, path = parse_flag("a=rel/dir")
    assert name == "a" and Path(path).is_absolute() and path.endswith("rel/dir")
    with pytest.raises(SluiceError) as info:
        parse_flag("no-equals")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(SluiceError):
        read_rank("/definitely/not/here")


def test_adapters_are_off_unless_asked_for() -> None:
    from model_service.config import build_parser, config_from_args

    def slots(*argv: str) -> int | None:
        return config_from_args(build_parser().parse_args(list(argv))).engine.max_loras

    assert slots() == 0
    assert slots("--lora", "a=/x") == 4
    assert slots("--lora", "a=/x", "--max-loras", "1") == 1
    assert slots("--max-loras", "3") == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--max-lora-rank", "12"])  # not a size vLLM has
