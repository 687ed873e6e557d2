"""Sluice's benchmark harness: `python -m scripts.bench --help`.

One module per concept:

| module | concept |
| --- | --- |
| `config.py` | the options, one dataclass per concern, and the CLI made from them |
| `workload.py` | prompt and output-length distributions -> request specs |
| `record.py` | what is measured about one request |
| `sse_reader.py` | HTTP/1.1 + chunked + SSE framing over a raw asyncio socket (bytes only) |
| `openai_driver.py` | OpenAI-compatible SSE servers (our edge, vLLM's own server) |
| `grpc_driver.py` | the worker's `Generate` RPC directly |
| `load.py` | closed loop (fixed concurrency) or open loop (Poisson arrivals), warm-up, bounds |
| `fanout.py` | the same load split over several harness processes |
| `progress.py` | one-line live progress on stderr |
| `stats.py` | percentiles and the run summary |
| `report.py` | JSON and markdown results |
| `plot.py` | PNG plot (matplotlib) |
| `stacks.py` | starting the processes under test (sim worker, edge, vllm-router, vLLM) |
| `procwatch.py` | their CPU and memory from /proc over the measured window |
| `modes.py` | run, overhead and compare orchestration |
| `overhead.py` | overhead mode's figures: added latency per hop, CPU per event and per request |
| `conversations.py` | multi-turn workload: shared system prompts, growing histories |
| `routing.py` | routing mode: placement policies and vllm-router's, prefix-caching sim workers |
| `decision.py` | decision mode: the edge's worker choice timed in process |
| `selftest.py` | the SSE reader's parsing speed on a synthetic buffer |
"""
