"""Test only (`--vllm-openai-port-file`): vLLM's own OpenAI server (its FastAPI app, built
by vLLM's launcher functions) over the worker's running `AsyncLLM`, on 127.0.0.1, so that
a test can send the same request to it and to the edge and compare the answers' shapes
without a second engine. Never on in production: it bypasses the worker's admission."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from model_service.config import EngineConfig

log = logging.getLogger("sluice.engine.vllm")


class VllmOpenAIServer:
    """vLLM's app served by uvicorn in the worker's own event loop (no signal handlers:
    the worker keeps its shutdown order)."""

    def __init__(self) -> None:
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, llm: Any, config: EngineConfig, port_file: str) -> None:
        import uvicorn
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        argv = ["--model", config.model, "--served-model-name", config.model_name]
        if config.vllm.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser"]
            argv.append(config.vllm.tool_call_parser)
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        tasks = await llm.get_supported_tasks()
        app = build_app(args, tasks, llm.model_config)
        await init_app_state(llm, app.state, args, tasks)

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self._server = Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        port = sock.getsockname()[1]
        await asyncio.to_thread(_write_port, port_file, port)
        log.info("vLLM's own OpenAI server (test only) on 127.0.0.1:%d", port)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)


def _write_port(path: str, port: int) -> None:
    """Atomically: a reader never sees a half-written port."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(str(port))
    tmp.replace(path)
