"""API keys and the admin key: who may call which path (`classify`, the one table). Only
SHA-256 digests are kept; a key's name picks its limits, so two keys under one name share
them (how a key is rotated). `python -m edge.security.auth new-key|hash-key --name NAME`
prints a key line. Unknown paths need a key: a route added later is never open by mistake."""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from edge.errors import ApiError, error_response
from edge.obs.record import record_of

log = logging.getLogger("sluice.edge")

KEYS_ENV = "SLUICE_API_KEYS"
ADMIN_KEY_ENV = "SLUICE_ADMIN_KEY"
MIN_KEY_CHARS = 16
ANONYMOUS = "anonymous"  # the caller when authentication is off
PUBLIC, ADMIN, API = "public", "admin", "api"

_NAME = r"[A-Za-z0-9_.@+-]{1,64}"
_HASHED = re.compile(rf"(?:({_NAME}):)?sha256:([0-9a-fA-F]{{64}})")
_NAMED = re.compile(rf"({_NAME}):(\S+)")
_PUBLIC_PATHS = frozenset({"/", "/health", "/healthz", "/readyz"})
_STREAM_LINK = re.compile(r"/v1/streams/[^/]+")
_READ_METHODS = frozenset({"GET", "HEAD"})


class KeyFileError(ValueError):
    """A keys file or `$SLUICE_API_KEYS` entry that is not a valid key line."""


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def default_name(hex_digest: str) -> str:
    """A name for an unnamed key: from its hash (32 bits of it: no help to an attacker)."""
    return f"key-{hex_digest[:8]}"


def parse_entry(line: str) -> tuple[str, str]:
    """One key line -> (name, lowercase hex SHA-256). Raises KeyFileError.

    <key>                   a key in clear (named key-<first 8 hex of its SHA-256>)
    <name>:<key>            a named key in clear
    sha256:<64 hex>         a key's SHA-256, so the file holds no secret
    <name>:sha256:<64 hex>  the same, named (the recommended form)
    """
    line = line.strip()
    if m := _HASHED.fullmatch(line):
        hexd = m.group(2).lower()
        return m.group(1) or default_name(hexd), hexd
    m = _NAMED.fullmatch(line)
    name, key = (m.group(1), m.group(2)) if m else ("", line)
    if not key or any(c.isspace() for c in key):
        raise KeyFileError("a key must be one word without spaces")
    if len(key) < MIN_KEY_CHARS:
        raise KeyFileError(
            f"a key must have at least {MIN_KEY_CHARS} characters "
            "(make one with `python -m edge.security.auth new-key`)"
        )
    hexd = digest(key).hex()
    return name or default_name(hexd), hexd


def parse_entries(lines: Iterable[str], source: str) -> list[tuple[str, str]]:
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.append(parse_entry(line))
        except KeyFileError as err:
            raise KeyFileError(f"{source}, entry {n}: {err}") from None  # never echo the key
    return out


def load_keys(path: str, env: str | None = None) -> list[str]:
    """Every configured key as "name:hexdigest" (what EdgeConfig carries; no secrets).

    `env` is `$SLUICE_API_KEYS` (commas or newlines between entries, so a Kubernetes
    Secret holding a keys file can be passed as the variable).
    """
    entries: list[tuple[str, str]] = []
    if path:
        with open(path) as f:
            entries += parse_entries(f.read().splitlines(), path)
    env = os.environ.get(KEYS_ENV, "") if env is None else env
    if env.strip():
        entries += parse_entries(re.split(r"[,\n]", env), f"${KEYS_ENV}")
    return list(dict.fromkeys(f"{name}:{hexd}" for name, hexd in entries))


class KeyStore:
    """The configured API keys, by digest. Empty: authentication is off."""

    def __init__(self, entries: Iterable[str]) -> None:
        self._keys: dict[bytes, tuple[bytes, str]] = {}
        for entry in entries:
            name, _, hexd = entry.rpartition(":")
            stored = bytes.fromhex(hexd)
            self._keys[stored] = (stored, name)

    def __len__(self) -> int:
        return len(self._keys)

    def names(self) -> set[str]:
        return {name for _, name in self._keys.values()}

    def identify(self, key: str) -> str | None:
        """The name of `key`, or None.

        Safe against timing attacks: only digests are compared, so a timing difference
        could at most tell how many leading bytes of SHA-256(a guess) match a stored
        digest, which does not help find a key (that takes a preimage). Keys are random
        256-bit tokens, so an unsalted fast hash suffices; do not use passwords as keys.
        """
        d = digest(key)
        found = self._keys.get(d)
        if found is None:
            return None
        # The lookup matched equal digests already; compare_digest keeps the deciding
        # comparison constant-time should the lookup ever change.
        stored, name = found
        return name if hmac.compare_digest(stored, d) else None


def classify(method: str, path: str) -> str:
    """PUBLIC, ADMIN or API for a request: the one access table.

    - public: `GET /`, `/health`, `/healthz`, `/readyz`, `GET /v1/streams/{token}` (an
      unguessable, expiring, signed capability: EventSource cannot send headers);
    - admin: `/metrics` and `/admin/...` (the admin key: none sent 401, a wrong one 403;
      with no admin key `/admin` is not installed and `/metrics` is open only while no
      API key is configured either);
    - every other path, unknown and future ones included: an API key, when any is
      configured (none: authentication is off, with a warning at start).
    """
    if path in _PUBLIC_PATHS or _STREAM_LINK.fullmatch(path):
        # A stream link is public to read; POST /v1/streams (one segment less) is API.
        if method in _READ_METHODS:
            return PUBLIC
    if path == "/metrics" or path == "/admin" or path.startswith("/admin/"):
        return ADMIN
    return API


def bearer(scope: Scope) -> str:
    """The token of an `Authorization: Bearer ...` header, else of `X-Api-Key` (how
    Anthropic's clients send a key), or ""."""
    api_key = ""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
        if name == b"x-api-key":
            api_key = value.decode("latin-1").strip()
    return api_key


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


def forbidden(message: str) -> ApiError:
    return ApiError(403, message, type="permission_error", code="forbidden")


class AuthMiddleware:
    """Checks the key a request needs (`classify`); puts the caller's name and tenant in
    the request's record (`edge.obs.record`) for API requests, so limits, usage and logs
    know who called. The only place the admin key is checked."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyStore,
        admin: str,
        failures: dict[str, int],
        tenants: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.keys = keys
        self.tenants = tenants or {}  # key name -> tenant (`--key-tenant`; else the name)
        self.admin = digest(admin) if admin else None
        self.failures = failures  # Metrics.auth_failures: counted by reason

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        access = classify(scope.get("method", "GET"), scope["path"])
        if access == PUBLIC:
            await self.app(scope, receive, send)
            return
        token = bearer(scope)
        error = self._check(access, token, scope)
        if error is None:
            await self.app(scope, receive, send)
            return
        self.failures["missing" if not token else "invalid"] += 1
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        challenge = {"www-authenticate": 'Bearer realm="sluice"'} if error.status == 401 else None
        await error_response(error, challenge)(scope, receive, send)

    def _check(self, access: str, token: str, scope: Scope) -> ApiError | None:
        if access == ADMIN:
            return self._check_admin(token, scope["path"])
        if not self.keys:
            record_of(scope).caller = ANONYMOUS
            return None
        if not token:
            return unauthorized(
                "You didn't provide an API key. Send it in an Authorization header "
                "(Authorization: Bearer YOUR_KEY) or an X-Api-Key header."
            )
        name = self.keys.identify(token)
        if name is None:
            return unauthorized("Incorrect API key provided.")
        rec = record_of(scope)
        rec.caller, rec.tenant = name, self.tenants.get(name, name)
        return None

    def _check_admin(self, token: str, path: str) -> ApiError | None:
        """The admin key, answered as edge.admin does: none sent 401, a wrong one 403."""
        if self.admin is None:
            # No admin key: /admin is off (its routes are not even installed: 404);
            # /metrics is open only while nothing else is protected either.
            if not self.keys or path != "/metrics":
                return None
            return forbidden("no admin key is configured (--admin-key): /metrics is closed")
        if not token:
            return unauthorized("this endpoint needs the admin key (Authorization: Bearer)")
        if not hmac.compare_digest(digest(token), self.admin):
            return forbidden("wrong admin key")
        return None


# -- CLI: python -m edge.security.auth new-key | hash-key --------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edge.security.auth", description="Sluice API keys.")
    sub = p.add_subparsers(dest="command", required=True)
    new = sub.add_parser("new-key", help="make a random key; print it and its keys-file line")
    new.add_argument("--name", default="", help="the key's name (logs, limits)")
    hsh = sub.add_parser("hash-key", help="read a key on stdin; print its keys-file line")
    hsh.add_argument("--name", default="", help="the key's name (logs, limits)")
    args = p.parse_args(argv)
    if args.name and not re.fullmatch(_NAME, args.name):
        p.error(f"--name must match {_NAME}")
    if args.command == "new-key":
        key = "sk-sluice-" + secrets.token_urlsafe(32)
        print(f"key (give it to the client; it is not stored): {key}", file=sys.stderr)
    else:
        key = sys.stdin.readline().strip()
        try:
            parse_entry(key)
        except KeyFileError as err:
            p.error(str(err))
    prefix = f"{args.name}:" if args.name else ""
    print(f"{prefix}sha256:{digest(key).hex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
