"""Security and limits, wired: the CLI flags, and the middleware around the app.

Order around the Starlette app, outermost first (MetricsMiddleware, in `edge.app`, is
outside all of them, so 401s and 429s are counted too):

    access log (JSON mode) -> CORS -> authentication -> limits -> app

CORS sits outside authentication so preflights (which carry no key) are answered and
refusals carry CORS headers; limits sit inside it because they are per key.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from edge import auth, tls
from edge.auth import AuthMiddleware, KeyFileError, KeyStore
from edge.cors import check_origins, cors_middleware
from edge.limits import LimitsMiddleware
from edge.logs import AccessLogMiddleware
from edge.metrics import ASGIApp, Metrics
from edge.tls import WorkerTLS

log = logging.getLogger("sluice.edge")
STAMP_HEADER = "x-sluice-stamp-times"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The security and limits flags of `python -m edge`."""
    g = p.add_argument_group("security and limits")
    g.add_argument(
        "--api-keys-file",
        default="",
        help=f"API keys, one per line: KEY, NAME:KEY or NAME:sha256:HEX (also ${auth.KEYS_ENV},"
        " comma-separated); none: authentication off",
    )
    g.add_argument(
        "--rate-limit", type=float, default=0.0, help="requests per second per key (0: off)"
    )
    g.add_argument(
        "--rate-burst", type=int, default=0, help="token bucket depth (0: the rate, at least 1)"
    )
    g.add_argument(
        "--max-streams-per-key",
        type=int,
        default=0,
        help="generations in flight per key (0: no limit)",
    )
    g.add_argument(
        "--max-prompt-chars",
        type=int,
        default=0,
        help="longest prompt (all messages together), characters (0: no limit)",
    )
    g.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="browser origin allowed to call the API, scheme://host[:port] (repeat; '*': any)",
    )
    g.add_argument("--worker-tls-ca", default="", help="PEM roots to verify workers (TLS on)")
    g.add_argument("--worker-tls-cert", default="", help="PEM client certificate (mTLS)")
    g.add_argument("--worker-tls-key", default="", help="PEM key of --worker-tls-cert")
    g.add_argument("--worker-tls-name", default="", help="name to verify in worker certificates")
    g.add_argument("--log-format", choices=("text", "json"), default="text")
    g.add_argument(
        "--allow-stamps",
        action="store_true",
        help="honour X-Sluice-Stamp-Times: 1 (worker time stamps in chunks, for benchmarks)",
    )


def fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """EdgeConfig fields for these flags, checked (SystemExit with the reason)."""
    if min(args.rate_limit, args.rate_burst, args.max_streams_per_key, args.max_prompt_chars) < 0:
        raise SystemExit("limits must be >= 0")
    try:
        keys = auth.load_keys(args.api_keys_file)
        check_origins(args.cors_origin)
        WorkerTLS(
            args.worker_tls_ca, args.worker_tls_cert, args.worker_tls_key, args.worker_tls_name
        ).check()
    except (KeyFileError, OSError, ValueError) as err:
        raise SystemExit(str(err)) from None
    return {
        "api_keys": keys,
        "rate_limit_rps": args.rate_limit,
        "rate_limit_burst": args.rate_burst,
        "max_streams_per_key": args.max_streams_per_key,
        "max_prompt_chars": args.max_prompt_chars,
        "cors_origins": args.cors_origin,
        "worker_tls_ca": args.worker_tls_ca,
        "worker_tls_cert": args.worker_tls_cert,
        "worker_tls_key": args.worker_tls_key,
        "worker_tls_name": args.worker_tls_name,
        "log_format": args.log_format,
        "allow_stamps": args.allow_stamps,
    }


def install(app: ASGIApp, config: Any, metrics: Metrics) -> ASGIApp:
    """Set this process's worker transport (TLS) and wrap `app` in the security layers."""
    tls.use(WorkerTLS.from_config(config))
    keys = KeyStore(config.api_keys)
    admin = auth.admin_key(config)
    if not keys:
        log.warning(
            "no API keys configured (--api-keys-file, $%s): authentication is OFF", auth.KEYS_ENV
        )
    elif not admin:
        log.warning("no admin key ($%s): /metrics and /admin are refused", auth.ADMIN_KEY_ENV)
    app = LimitsMiddleware(
        app,
        config.rate_limit_rps,
        config.rate_limit_burst,
        config.max_streams_per_key,
        metrics.admission_rejections,
    )
    app = AuthMiddleware(app, keys, admin, metrics.auth_failures)
    if config.cors_origins:
        app = cors_middleware(app, config.cors_origins)
    if config.log_format == "json":
        app = AccessLogMiddleware(app)
    return app


def stamps_wanted(headers: Any, config: Any) -> bool:
    """Whether a request gets worker time stamps in its chunks (`--allow-stamps` and the
    header `X-Sluice-Stamp-Times: 1`); off by default, it costs nothing then."""
    return bool(config.allow_stamps) and headers.get(STAMP_HEADER) == "1"
