#!/usr/bin/env bash
# Installs what the nginx integration tests need, from Debian's packages, only when it is
# missing: nginx (the `nginx-light` build is enough: ssl, http2, grpc, upstream keepalive)
# and h2load (`nghttp2-client`, an HTTP/2 load generator for the multiplexing test).
#
# Needs root (or passwordless sudo) when something is missing; a no-op otherwise, so
# `make test` can call it every time. Set SLUICE_SKIP_APT=1 to never touch apt (the nginx
# tests then skip when the binaries are absent).
set -euo pipefail

[ "${SLUICE_SKIP_APT:-0}" = "1" ] && exit 0

need=()
# nginx is usually in /usr/sbin, which a non-root PATH may lack.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  need+=(nginx)
fi
command -v h2load >/dev/null 2>&1 || need+=(h2load)
[ ${#need[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "install_nginx: missing ${need[*]} and not root; install nginx-light and nghttp2-client" >&2
    exit 0  # the nginx tests skip; everything else still runs
  fi
fi

# Map the missing binaries to packages; prefer the small nginx build when Debian has it.
pkgs=()
for bin in "${need[@]}"; do
  case "$bin" in
    nginx) pkgs+=(nginx-light) ;;
    h2load) pkgs+=(nghttp2-client) ;;
  esac
done

export DEBIAN_FRONTEND=noninteractive
apt_install() {
  $SUDO apt-get install -y -q --no-install-recommends "$@"
}
echo "==> install_nginx: installing ${pkgs[*]}"
if ! apt_install "${pkgs[@]}" >/dev/null 2>&1; then
  # A fresh machine has no package lists yet (or stale ones): refresh once, then retry.
  $SUDO apt-get update -q >/dev/null
  if ! apt_install "${pkgs[@]}"; then
    # Newer Debian dropped nginx-light (trixie ships one `nginx` with the same modules).
    pkgs=("${pkgs[@]/nginx-light/nginx}")
    apt_install "${pkgs[@]}"
  fi
fi

# Debian's nginx package starts a system-wide nginx on port 80 via its postinst when an
# init system runs; the tests start their own under a temp prefix and need none.
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
"$nginx_bin" -v
command -v h2load >/dev/null && h2load --version | head -1
