"""Render `nginx.conf.template` (beside this file) into a runnable nginx configuration.

    python scripts/deploy/render_nginx.py --prefix /srv/sluice-nginx \\
        --cert /etc/sluice/tls/tls.crt --key /etc/sluice/tls/tls.key \\
        --listen 0.0.0.0:443 --grpc-listen 0.0.0.0:8443 \\
        --edge 10.0.0.11:8000 --edge 10.0.0.12:8000 \\
        --worker 10.0.0.21:50051 --worker 10.0.0.22:50051
    nginx -p /srv/sluice-nginx -c /srv/sluice-nginx/nginx.conf -g 'daemon off;'

It writes PREFIX/nginx.conf and makes PREFIX/logs and PREFIX/tmp, where nginx keeps its
pid, logs and temp files, so any user can run it. Only the HTTP/2 `listen` syntax depends
on the nginx version (`http2 on;` from 1.25.1); it is read from `nginx -v` unless given.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file (`python scripts/deploy/render_nginx.py`)

from sluice_common.options import add_section, option, section_from  # noqa: E402

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
_FIELD = re.compile(r"\{\{ (\w+) \}\}")
# host:port, [v6]:port or a bare port; nothing that could end a directive or a block.
_ADDRESS = re.compile(r"^(?:[A-Za-z0-9.\-]+:|\[[0-9A-Fa-f:.]+\]:)?\d{1,5}$")
_SAFE_VALUE = re.compile(r"^[^\s;{}'\"#$]+$")
HTTP2_ON_SINCE = (1, 25, 1)


@dataclass(slots=True)
class NginxParams:
    """What differs between deployments; the template holds everything else. The flagged
    fields are the command line's (`--prefix`, `--cert`, `--key`, `--edge`, `--worker`
    required there)."""

    prefix: Path = option(Path("."), "--prefix", "nginx -p directory", type=Path, required=True)
    # PEM certificate (chain) clients see, on both listeners.
    tls_cert: str = option("", "--cert", "PEM certificate chain for clients", required=True)
    tls_key: str = option("", "--key", "PEM private key of --cert", required=True)
    edges: list[str] = option(
        [], "--edge", "edge host:port (repeat)", action="append", required=True
    )
    # Model workers: the gRPC listener's upstreams.
    workers: list[str] = option(
        [], "--worker", "worker host:port (repeat)", action="append", required=True
    )
    # HTTPS (HTTP/2 and HTTP/1.1) for the edges; gRPC over TLS for the workers.
    listen: str = option("0.0.0.0:443", "--listen", "HTTPS listen address")
    grpc_listen: str = option("0.0.0.0:8443", "--grpc-listen", "gRPC (TLS) listen address")
    # >= the edge's --request-timeout (see the template).
    read_timeout_s: float = option(600.0, "--read-timeout", "seconds")
    # A little above the edge's --max-body-bytes (4 MiB).
    max_body: str = option("5m", "--max-body", "client_max_body_size, e.g. 5m")
    # Request heads, as the edge bounds them (--header-timeout, --max-header-bytes):
    # large_client_header_buffers 4 x 8k = the edge's 32 KiB.
    header_timeout_s: float = 10.0
    worker_processes: str = option(
        "auto", "--worker-processes", "nginx worker_processes (auto: one per core)"
    )
    error_log_level: str = "warn"
    # The `user` directive: only meaningful when nginx starts as root.
    user: str = option("", "--user", "user directive (when started as root)")
    # gRPC to workers that run TLS: verify them with this CA (and present a client
    # certificate when they require mTLS). Empty: plaintext gRPC inside the cluster.
    worker_tls_ca: str = option("", "--worker-tls-ca", "CA of the workers' TLS certificates")
    worker_client_cert: str = option("", "--worker-client-cert", "client cert for worker mTLS")
    worker_client_key: str = option("", "--worker-client-key", "key of --worker-client-cert")
    # A DNS name in the workers' certificates.
    worker_tls_name: str = option("sluice-worker", "--worker-tls-name", "name in worker certs")
    nginx_version: tuple[int, ...] | None = None  # None: ask `nginx -v`
    edge_server_options: str = "max_fails=1 fail_timeout=5s"
    extra: dict[str, str] = field(default_factory=dict)  # overrides of rendered fields


@dataclass(frozen=True, slots=True)
class Actions:
    """What the command line does besides rendering."""

    check: bool = option(False, "--check", "run `nginx -t` on the result", action="store_true")


def nginx_binary() -> str | None:
    """nginx on PATH, or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def detect_version(binary: str | None = None) -> tuple[int, ...] | None:
    """(major, minor, patch) from `nginx -v`, or None when nginx is not installed."""
    binary = binary or nginx_binary()
    if binary is None:
        return None
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=False)
    match = re.search(r"nginx/(\d+)\.(\d+)\.(\d+)", out.stderr + out.stdout)
    return tuple(int(g) for g in match.groups()) if match else None


def _check(kind: str, value: str, pattern: re.Pattern[str]) -> str:
    if not pattern.match(value):
        raise ValueError(f"bad {kind}: {value!r}")
    return value


def _listen(address: str, version: tuple[int, ...] | None) -> str:
    _check("listen address", address, _ADDRESS)
    if version is not None and version >= HTTP2_ON_SINCE:
        return f"        listen {address} ssl;\n        http2 on;"
    return f"        listen {address} ssl http2;"


def _servers(addresses: list[str], options: str) -> str:
    if not addresses:
        raise ValueError("at least one upstream address is needed")
    lines = [f"        server {_check('upstream', a, _ADDRESS)} {options};" for a in addresses]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds <= 0:
        raise ValueError(f"timeout must be positive: {seconds}")
    return f"{round(seconds * 1000)}ms"


def _grpc_upstream_tls(p: NginxParams) -> str:
    if not p.worker_tls_ca:
        if p.worker_client_cert or p.worker_client_key:
            raise ValueError("a client certificate for the workers needs --worker-tls-ca")
        return ""
    lines = [
        f"        grpc_ssl_trusted_certificate {_check('path', p.worker_tls_ca, _SAFE_VALUE)};",
        "        grpc_ssl_verify on;",
        # Checked against the workers' certificates; without it nginx would check the
        # upstream block's name ("sluice_workers").
        f"        grpc_ssl_name {_check('name', p.worker_tls_name, _SAFE_VALUE)};",
        "        grpc_ssl_server_name on;",
    ]
    if p.worker_client_cert:
        lines.append(
            f"        grpc_ssl_certificate {_check('path', p.worker_client_cert, _SAFE_VALUE)};"
        )
        lines.append(
            f"        grpc_ssl_certificate_key {_check('path', p.worker_client_key, _SAFE_VALUE)};"
        )
    return "\n".join(lines)


def render(p: NginxParams) -> str:
    """The configuration text. Raises ValueError on a bad value or an unfilled field."""
    version = p.nginx_version if p.nginx_version is not None else detect_version()
    prefix = str(p.prefix)
    values = {
        "prefix": _check("prefix", prefix, _SAFE_VALUE),
        "user_line": f"user {_check('user', p.user, _SAFE_VALUE)};" if p.user else "",
        "worker_processes": _check("worker_processes", p.worker_processes, _SAFE_VALUE),
        "error_log_level": _check("error_log_level", p.error_log_level, _SAFE_VALUE),
        "https_listen": _listen(p.listen, version),
        "grpc_listen": _listen(p.grpc_listen, version),
        "tls_cert": _check("path", p.tls_cert, _SAFE_VALUE),
        "tls_key": _check("path", p.tls_key, _SAFE_VALUE),
        "edge_servers": _servers(p.edges, p.edge_server_options),
        "worker_servers": _servers(p.workers, "max_fails=1 fail_timeout=5s"),
        "read_timeout": _duration(p.read_timeout_s),
        "header_timeout": _duration(p.header_timeout_s),
        "max_body": _check("max_body", p.max_body, re.compile(r"^\d+[kKmMgG]?$")),
        "grpc_scheme": "grpcs" if p.worker_tls_ca else "grpc",
        "grpc_upstream_tls": _grpc_upstream_tls(p),
        **p.extra,
    }
    text = TEMPLATE.read_text()
    missing = sorted(set(_FIELD.findall(text)) - values.keys())
    if missing:
        raise ValueError(f"template fields without a value: {', '.join(missing)}")
    return _FIELD.sub(lambda m: values[m.group(1)], text)


def write(p: NginxParams) -> Path:
    """Render into PREFIX/nginx.conf, making PREFIX/logs and PREFIX/tmp. Returns the path."""
    for sub in ("logs", "tmp"):
        (p.prefix / sub).mkdir(parents=True, exist_ok=True)
    conf = p.prefix / "nginx.conf"
    conf.write_text(render(p))
    return conf


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Render Sluice's nginx.conf.")
    add_section(ap, "nginx", NginxParams)
    add_section(ap, "actions", Actions)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    params = section_from(a, "nginx", NginxParams)
    params.prefix = params.prefix.resolve()
    conf = write(params)
    print(conf)
    if section_from(a, "actions", Actions).check:
        binary = nginx_binary()
        if binary is None:
            print("nginx is not installed", file=sys.stderr)
            return 1
        return subprocess.run([binary, "-t", "-p", str(params.prefix), "-c", str(conf)]).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
