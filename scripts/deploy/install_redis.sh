#!/usr/bin/env bash
# Installs Debian's redis-server, the shared store of the edge's fleet tests (and of a
# fleet: `--store-url redis://...`), only when it is missing. The tests start their own
# redis-server on a free port; none is needed system-wide (`make serve` needs none).
#
# Needs root (or passwordless sudo) when it is missing; a no-op otherwise, so `make test`
# can call it every time. Set SLUICE_SKIP_APT=1 to never touch apt (the Redis tests then
# fail, naming this script).
set -euo pipefail

[ "${SLUICE_SKIP_APT:-0}" = "1" ] && exit 0
if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install_redis: redis-server missing and not root; install Debian's redis-server" >&2
    exit 0
  fi
fi

export DEBIAN_FRONTEND=noninteractive
apt_install() {
  $SUDO apt-get install -y -q --no-install-recommends redis-server
}
echo "==> install_redis: installing redis-server"
if ! apt_install >/dev/null 2>&1; then
  # A fresh machine has no package lists yet (or stale ones): refresh once, then retry.
  $SUDO apt-get update -q >/dev/null
  apt_install
fi
# Debian's package starts a system-wide redis on 6379 when an init system runs; the
# tests start their own and need none.
redis-server --version
