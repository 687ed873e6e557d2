"""Values of the edge's configuration that cannot work, refused at the command line (a
SystemExit with the reason) rather than at first use. The options themselves are declared
in `edge.config`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.config import EdgeConfig

NAME_RE = r"[A-Za-z0-9_.@+-]{1,64}"  # a key's or tenant's name


def check(config: EdgeConfig) -> None:
    """Values that cannot work, refused at the command line rather than at first use."""
    s, r, sec = config.stream, config.routing, config.security
    if s.heartbeat_s <= 0 or s.request_timeout_s <= 0 or config.server.processes < 1:
        raise SystemExit("--heartbeat and --request-timeout must be positive, --processes >= 1")
    if r.max_tries < 1 or r.retry_budget_s < 0 or r.max_fails < 0:
        raise SystemExit("--max-tries must be at least 1, --retry-budget/--max-fails >= 0")
    if r.load_interval_s < 0 or r.prefix_block_chars < 1 or r.prefix_index_blocks < 1:
        raise SystemExit("--load-interval >= 0, --prefix-block-chars/--prefix-index-blocks >= 1")
    if min(sec.rate_limit_rps, sec.rate_limit_burst, sec.max_streams_per_key, sec.tpm_limit) < 0:
        raise SystemExit("limits must be >= 0")
    if min(sec.max_prompt_chars, sec.max_tools_chars, sec.max_arguments_chars) < 0:
        raise SystemExit("--max-prompt-chars, --max-tools-chars, --max-arguments-chars >= 0")
    for entry in r.loras:
        name, sep, path = entry.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--lora {entry!r}: expected NAME=PATH")
    if sec.max_tools < 1:
        raise SystemExit("--max-tools must be at least 1")
    for entry in sec.key_priorities:
        name, _, cls = entry.partition("=")
        if not name or cls.lower() not in ("high", "normal", "low"):
            raise SystemExit(f"--key-priority {entry!r}: expected NAME=high|normal|low")
    _check_tenancy(config)
    if config.store.url and not config.store.url.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit("--store-url must be redis://, rediss:// or unix://")
    if config.store.timeout_s <= 0:
        raise SystemExit("--store-timeout must be positive")
    if config.session.ttl_s <= 0 or config.session.store_max < 1:
        raise SystemExit("--session-ttl must be positive, --session-store-max at least 1")
    if config.session.samesite == "none" and not config.session.secure:
        raise SystemExit("--session-cookie-samesite none needs --session-cookie-secure")


def _check_tenancy(config: EdgeConfig) -> None:
    """Budgets, tenants and the audit log's settings (their parsers live with them; the
    shapes are checked here, before anything starts)."""
    for entry in config.security.key_budgets:
        name, _, rest = entry.partition("=")
        amount, _, period = rest.partition("/")
        if not name or not amount.isdigit() or int(amount) < 1 or period not in ("day", "month"):
            raise SystemExit(f"--key-budget {entry!r}: expected NAME=TOKENS/day or /month")
    for entry in config.security.key_tenants:
        name, _, tenant = entry.partition("=")
        if not re.fullmatch(NAME_RE, name) or not re.fullmatch(NAME_RE, tenant):
            raise SystemExit(f"--key-tenant {entry!r}: expected NAME=TENANT ({NAME_RE})")
    a = config.audit
    if a.max_bytes < 1024 or a.backups < 0 or a.queue < 1:
        raise SystemExit("--audit-max-bytes >= 1024, --audit-backups >= 0, --audit-queue >= 1")
    for rule in a.redact:
        if not rule.startswith("/"):
            try:
                re.compile(rule)
            except re.error as exc:
                raise SystemExit(f"--audit-redact {rule!r}: not a regex ({exc})") from None
