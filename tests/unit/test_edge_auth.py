"""API keys (forms, hashing, lookup), the access table, Bearer parsing, the key CLI, and the
checks of the CORS and worker-TLS flags."""

from __future__ import annotations

import hashlib
import io

import pytest

from edge.config import WorkerTLSConfig
from edge.security import auth, tls
from edge.security.auth import ADMIN, API, PUBLIC, KeyFileError, KeyStore, classify, parse_entry
from edge.security.cors import check_origins

KEY = "sk-sluice-0123456789abcdef"
HEX = hashlib.sha256(KEY.encode()).hexdigest()


@pytest.mark.parametrize(
    ("line", "name"),
    [
        (KEY, f"key-{HEX[:8]}"),
        (f"alice:{KEY}", "alice"),
        (f"sha256:{HEX}", f"key-{HEX[:8]}"),
        (f"alice:sha256:{HEX.upper()}", "alice"),
        (f"  ci-bot.prod:{KEY}  ", "ci-bot.prod"),
    ],
)
def test_every_line_form_gives_the_same_digest(line, name):
    assert parse_entry(line) == (name, HEX)


@pytest.mark.parametrize("line", ["short", "alice:short", "two words here and more", "alice:"])
def test_weak_or_malformed_keys_are_refused_without_echoing_them(line):
    with pytest.raises(KeyFileError) as err:
        auth.parse_entries(["# ok", "", line], "keys.txt")
    assert "entry 3" in str(err.value)
    assert line.strip() not in str(err.value)


def test_keys_from_file_and_environment_are_hashed_and_deduplicated(tmp_path):
    f = tmp_path / "keys"
    f.write_text(f"# comment\n\nalice:{KEY}\nbob:sha256:{'ab' * 32}\n")
    other = "sk-sluice-fedcba9876543210"
    entries = auth.load_keys(str(f), env=f"alice:sha256:{HEX}, {other}\ncarol:{other}")
    assert entries == [
        f"alice:{HEX}",
        f"bob:{'ab' * 32}",
        f"key-{hashlib.sha256(other.encode()).hexdigest()[:8]}:"
        + hashlib.sha256(other.encode()).hexdigest(),
        f"carol:{hashlib.sha256(other.encode()).hexdigest()}",
    ]
    assert not any(KEY in e or other in e for e in entries)
    assert auth.load_keys("", env="") == []


def test_key_store_finds_names_by_digest_and_rotation_shares_a_name():
    new = "sk-sluice-new-key-000000000"
    store = KeyStore([f"alice:{HEX}", f"alice:{hashlib.sha256(new.encode()).hexdigest()}"])
    assert len(store) == 2
    assert store.identify(KEY) == "alice" and store.identify(new) == "alice"
    assert store.identify(KEY + "x") is None and store.identify("") is None
    assert not KeyStore([])


@pytest.mark.parametrize(
    ("method", "path", "access"),
    [
        ("GET", "/", PUBLIC),
        ("HEAD", "/healthz", PUBLIC),
        ("GET", "/readyz", PUBLIC),
        ("GET", "/v1/streams/abc.def.123.sig", PUBLIC),
        ("POST", "/v1/streams", API),
        ("POST", "/v1/streams/abc", API),  # only reading a link is public
        ("GET", "/v1/streams/a/b", API),
        ("POST", "/", API),
        ("GET", "/healthz/", API),
        ("GET", "/metrics", ADMIN),
        ("GET", "/admin/pools", ADMIN),
        ("DELETE", "/admin", ADMIN),
        ("GET", "/administrator", API),
        ("POST", "/v1/chat/completions", API),
        ("GET", "/anything/new", API),
    ],
)
def test_access_table(method, path, access):
    assert classify(method, path) == access


@pytest.mark.parametrize(
    ("headers", "token"),
    [
        ([(b"authorization", b"Bearer abc")], "abc"),
        ([(b"authorization", b"bearer   abc  ")], "abc"),
        ([(b"authorization", b"Basic abc")], ""),
        ([(b"authorization", b"Bearer")], ""),
        # Anthropic's clients send their key as X-Api-Key; a Bearer token wins over it.
        ([(b"x-api-key", b" abc ")], "abc"),
        ([(b"x-api-key", b"abc"), (b"authorization", b"Bearer def")], "def"),
        ([(b"authorization", b"Bearer def"), (b"x-api-key", b"abc")], "def"),
        ([], ""),
    ],
)
def test_bearer(headers, token):
    assert auth.bearer({"headers": headers}) == token


def test_cli_hash_key_and_new_key(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    assert auth.main(["hash-key", "--name", "alice"]) == 0
    assert capsys.readouterr().out.strip() == f"alice:sha256:{HEX}"
    assert auth.main(["new-key"]) == 0
    out = capsys.readouterr()
    key = out.err.rsplit(" ", 1)[1].strip()
    line = out.out.strip()
    assert KeyStore([":".join(parse_entry(line))]).identify(key) is not None
    assert key not in line


def test_cors_origins_are_checked():
    assert check_origins(["https://a.example", "http://localhost:5173"]) == [
        "https://a.example",
        "http://localhost:5173",
    ]
    assert check_origins(["*"]) == ["*"]
    for bad in (["https://a.example/"], ["a.example"], ["*", "https://a.example"]):
        with pytest.raises(ValueError):
            check_origins(bad)


def test_worker_tls_settings_are_checked(tmp_path):
    assert not WorkerTLSConfig().enabled and WorkerTLSConfig(server_name="w").enabled
    assert tls.credentials(WorkerTLSConfig()) is None
    with pytest.raises(ValueError, match="together"):
        tls.check(WorkerTLSConfig(cert="a.crt"))
    with pytest.raises(ValueError, match="no such file"):
        tls.check(WorkerTLSConfig(ca=str(tmp_path / "none.pem")))
