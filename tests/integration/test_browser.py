"""The chat page in real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright; no browser is downloaded): the edge process is killed mid-answer and started
again, EventSource reconnects by itself with Last-Event-ID, and the answer shown at the
end equals the uninterrupted one. A screenshot of the finished page is saved."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import httpx
import pytest

from tests.integration.edge_fixtures import EDGE_ENV, wait_ready
from tests.procs import ROOT, start_edge, start_worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
QUESTION = "Tell me a long story about a river."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_chat_page_survives_an_edge_restart_mid_answer() -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    assert Path(CHROMIUM).exists(), "chromium is missing: run scripts/install_chromium.sh"
    # 80 tokens at 40 ms: a ~3 s answer; the worker keeps it running while nobody reads.
    worker = start_worker(
        "--engine",
        "sim",
        "--sim-token-delay",
        "0.04",
        "--sim-answer-tokens",
        "80",
        "--default-detach-grace",
        "20",
    )
    port = free_port()
    edge_args = ("--worker", worker.address, "--port", str(port), "--retry-ms", "300")
    edge = start_edge(*edge_args, env=EDGE_ENV)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base)
        want = httpx.post(
            f"{base}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": QUESTION}],
                "max_tokens": 60,
                "temperature": 0,
            },
            timeout=30,
        ).json()["choices"][0]["message"]["content"]
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(base + "/")
                page.click("summary")  # open the settings
                page.fill("#max", "60")
                page.fill("#temp", "0")
                page.fill("#prompt", QUESTION)
                page.click("#send")
                page.wait_for_function(
                    "Number(document.getElementById('tokens').textContent) >= 10"
                )
                edge.kill()  # the connection drops mid-answer
                page.wait_for_selector("#status[data-state=reconnecting]", timeout=10_000)
                partial = page.text_content("#answer") or ""
                assert 0 < len(partial) < len(want)
                edge = start_edge(*edge_args, env=EDGE_ENV)  # same port, same secret
                page.wait_for_selector("#status[data-state=done]", timeout=30_000)
                shown = page.text_content("#answer")
                reconnects = int(page.text_content("#reconnects") or "0")
                ARTIFACTS.mkdir(exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "chat-page-resumed.png"), full_page=True)
            finally:
                browser.close()
        assert reconnects >= 1
        assert shown == want
    finally:
        edge.kill()
        worker.kill()
