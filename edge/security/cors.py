"""CORS for browsers on other origins: Starlette's CORSMiddleware over an allowlist
(`--cors-origin`). Keys travel in `Authorization` (or Anthropic's `X-Api-Key`), never in
cookies, so credentials are never allowed and `*` means any origin without them;
preflights are answered before authentication, and errors (401, 429) carry the headers
too."""

from __future__ import annotations

import re
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

ALLOW_METHODS = ("GET", "POST", "DELETE", "OPTIONS")  # DELETE: a stored response
ALLOW_HEADERS = (
    "anthropic-version",  # what Anthropic's clients send with their key
    "authorization",
    "content-type",
    "last-event-id",
    "x-request-id",
    "x-request-timeout",
    "x-api-key",
    "x-session-id",
)
EXPOSE_HEADERS = ("x-request-id", "retry-after", "retry-after-ms", "x-sluice-worker")
MAX_AGE_S = 600
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:\d{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def check_origins(origins: Sequence[str]) -> list[str]:
    """The allowlist, checked: `scheme://host[:port]` each (no path, no trailing slash),
    or `*` alone. Raises ValueError."""
    out = []
    for o in origins:
        if o == "*":
            if len(origins) > 1:
                raise ValueError("--cors-origin '*' must be the only origin")
        elif not _ORIGIN.fullmatch(o):
            raise ValueError(f"--cors-origin {o!r} is not an origin (scheme://host[:port])")
        out.append(o)
    return out


def cors_middleware(app: ASGIApp, origins: Sequence[str]) -> ASGIApp:
    return CORSMiddleware(
        app,
        allow_origins=check_origins(origins),
        allow_methods=ALLOW_METHODS,
        allow_headers=ALLOW_HEADERS,
        allow_credentials=False,
        expose_headers=EXPOSE_HEADERS,
        max_age=MAX_AGE_S,
    )
