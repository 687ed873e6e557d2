#!/usr/bin/env bash
# Installs Debian's chromium for the chat-page browser test, only when it is missing.
# Playwright (a dev dependency) drives this binary; no browser is ever downloaded.
# Needs root (or passwordless sudo) when chromium is missing; a no-op otherwise.
set -euo pipefail
[ "${SLUICE_SKIP_APT:-0}" = "1" ] && exit 0
command -v chromium >/dev/null 2>&1 && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install_chromium: chromium is missing and this is not root: apt-get install chromium" >&2
    exit 0
  fi
fi
echo "==> installing Debian's chromium (browser test)"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null; then
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null
fi
