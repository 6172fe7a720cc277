"""A live OpenAI-compatible server for the server tests: uvicorn in a thread of the test process
on a free 127.0.0.1 port (so tests can look at the worker), and clients for it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

import uvicorn  # noqa: E402

from powerinfer_rs.server.app import create_app  # noqa: E402

MODEL_ID = "smollm2"


class LiveServer:
    """``create_app(engine, **options)`` served until :meth:`stop`; ``wrap``: an ASGI
    wrapper put around the app (to watch what reaches it)."""

    def __init__(self, engine, wrap=None, **options):
        self.engine = engine
        self.app = create_app(engine, model_id=MODEL_ID, **options)
        self.state = self.app.state.server
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        asgi = wrap(self.app) if wrap else self.app
        config = uvicorn.Config(asgi, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def client(self, api_key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kw
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120)

    @property
    def worker(self):
        return self.state.worker

    def wait_idle(self, jobs_done: int, timeout: float = 30.0) -> None:
        """Wait until the worker has finished ``jobs_done`` jobs in all."""
        deadline = time.monotonic() + timeout
        while self.worker.jobs_done < jobs_done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.worker.jobs_done} jobs done, waited for {jobs_done}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def chat(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]
