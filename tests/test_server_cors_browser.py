"""``--cors-origins`` in a real browser: headless Chromium (Debian's ``chromium`` package;
skipped where none is installed) loads a page from another origin (a second local HTTP server,
on its own port) whose script ``fetch()``-es a chat completion from our server with a JSON body
and an ``Authorization`` header, so the browser sends a real preflight first. From a listed
origin the answer lands in the page's DOM (read back with ``--dump-dom``); from an unlisted one
the browser refuses the call (``TypeError: Failed to fetch``) and the POST never reaches the
server. The SmolLM2 test model answers."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from powerinfer_rs import Engine

from live_server import LiveServer

BROWSER = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium installed")

KEY = "sekret"
BODY = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "temperature": 0}  # fmt: skip

#: The page: one fetch() of the chat route, its outcome written into <pre id="out">.
PAGE = """<!doctype html><html><body><pre id="out">pending</pre><script>
fetch("{url}/v1/chat/completions", {{
  method: "POST",
  headers: {{"Content-Type": "application/json", "Authorization": "Bearer {key}"}},
  body: JSON.stringify({body}),
}}).then(r => r.json().then(j => "status " + r.status + " " + JSON.stringify(j)))
  .catch(e => "error " + e)
  .then(t => {{ document.getElementById("out").textContent = t; }});
</script></body></html>"""


class PageServer:
    """A plain HTTP server on its own 127.0.0.1 port (so its own origin) serving :data:`PAGE`
    aimed at :attr:`api_url` (set once the API server runs)."""

    def __init__(self):
        self.api_url = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                body = json.dumps(BODY)
                page = PAGE.format(url=owner.api_url, key=KEY, body=body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Watch:
    """An ASGI wrapper keeping each HTTP request's method, path and preflight headers."""

    def __init__(self):
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    def __call__(self, app):
        async def watched(scope, receive, send):
            if scope["type"] == "http":
                headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
                self.seen.append((scope["method"], scope["path"], headers))
            await app(scope, receive, send)

        return watched


def browse(url: str, tmp_path) -> str:
    """The text of ``<pre id="out">`` once Chromium has run the page at ``url``: virtual time
    waits while requests are in flight, so the fetch has settled when the DOM is dumped."""
    profile = tmp_path / f"profile-{len(os.listdir(tmp_path))}"
    argv = [BROWSER, "--headless=new", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", "--virtual-time-budget=60000",
            "--dump-dom", url]  # fmt: skip
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    start = r.stdout.index('<pre id="out">') + len('<pre id="out">')
    return html.unescape(r.stdout[start : r.stdout.index("</pre>", start)])


@pytest.fixture(scope="module")
def served(smol):
    """``(server, watch, allowed page, unlisted page)``: the server lists only the first
    page's origin."""
    allowed, unlisted = PageServer(), PageServer()
    watch = Watch()
    live = LiveServer(Engine(smol, threads=1), wrap=watch, api_key=KEY,
                      cors_origins=allowed.origin)  # fmt: skip
    allowed.api_url = unlisted.api_url = live.url
    yield live, watch, allowed, unlisted
    for p in (allowed, unlisted):
        p.stop()
    live.stop()


def test_a_listed_origin_gets_the_answer_after_a_preflight(served, tmp_path):
    live, watch, allowed, _ = served
    del watch.seen[:]
    text = browse(allowed.origin + "/", tmp_path)
    assert text.startswith("status 200 "), text
    answer = json.loads(text.removeprefix("status 200 "))
    assert answer["object"] == "chat.completion"
    # The same request from Python (no browser, no Origin) gives the same greedy text.
    with live.http() as c:
        r = c.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    want = r.json()["choices"][0]["message"]["content"]
    assert answer["choices"][0]["message"]["content"] == want
    chat = [(m, h) for m, p, h in watch.seen if p == "/v1/chat/completions"]
    assert [m for m, _ in chat][:2] == ["OPTIONS", "POST"], chat  # the browser asked first
    pre, post = chat[0][1], chat[1][1]
    assert pre["origin"] == allowed.origin and pre["access-control-request-method"] == "POST"
    asked = {h.strip() for h in pre["access-control-request-headers"].split(",")}
    assert {"authorization", "content-type"} <= asked
    assert "authorization" not in pre  # the preflight carries no key
    assert post["authorization"] == f"Bearer {KEY}" and post["origin"] == allowed.origin


def test_an_unlisted_origin_is_refused_by_the_browser(served, tmp_path):
    live, watch, _, unlisted = served
    del watch.seen[:]
    done = live.worker.jobs_done
    text = browse(unlisted.origin + "/", tmp_path)
    assert text == "error TypeError: Failed to fetch", text
    chat = [m for m, p, _ in watch.seen if p == "/v1/chat/completions"]
    assert chat == ["OPTIONS"]  # refused at the preflight: the POST was never sent
    assert live.worker.jobs_done == done
