"""``python -m powerinfer_rs serve`` as a user starts it: a subprocess on a free loopback port,
answering the openai client, one log line per request; and its arguments."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from powerinfer_rs.cli import build_parser
from powerinfer_rs.server.cli import model_id

from live_server import chat, httpx, openai


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_arguments():
    a = build_parser().parse_args(["serve", "--model", "m.gguf", "--n-ctx", "512"])
    assert (a.host, a.port, a.ctx, a.max_queue, a.api_key) == ("127.0.0.1", 8000, 512, 64, None)
    assert model_id("/x/SmolLM2-135M-Instruct.Q4_1.gguf", None) == "SmolLM2-135M-Instruct.Q4_1"
    assert model_id("/x/model-dir/", None) == "model-dir"
    assert model_id("/x/gpt-oss-120b-mxfp4-00001-of-00003.gguf", None) == "gpt-oss-120b-mxfp4"
    assert model_id("/x/m.gguf", "local") == "local"
    assert a.pooling is None  # the model's pooling
    pooled = build_parser().parse_args(["serve", "--model", "m.gguf", "--pooling", "cls"])
    assert pooled.pooling == "cls"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m.gguf", "--pooling", "rank"])


def test_serve_command_answers_and_logs_each_request(smol_path, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "powerinfer_rs", "serve", "--model", str(smol_path)]
    argv += ["--threads", "1", "--port", str(port), "--api-key", "k", "--n-ctx", "1024"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
        model = client.models.list().data[0].id
        assert model == Path(smol_path).name.removesuffix(".gguf")
        got = client.chat.completions.create(
            model=model, messages=chat("Hi"), max_tokens=3, temperature=0
        )
        assert got.usage.completion_tokens <= 3
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    lines = [ln for ln in text.splitlines() if " in=" in ln and " out=" in ln]
    assert len(lines) == 1 and "chatcmpl-" in lines[0] and "ttft=" in lines[0], text
    assert "context 1024" in text and f"127.0.0.1:{port}" in text


def test_serve_refuses_a_bad_queue_size(smol_path):
    from powerinfer_rs.cli import main

    with pytest.raises(SystemExit, match="max-queue"):
        main(["serve", "--model", str(smol_path), "--max-queue", "0"])
