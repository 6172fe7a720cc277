"""``echo`` with ``logprobs`` on ``/v1/completions`` (server/echo.py): the prompt's text and
its tokens' log-probabilities, which equal the log-softmax of ``Engine.logits`` over the
prompt (lm-eval's loglikelihood requests: ``echo``, ``max_tokens: 0``)."""

from __future__ import annotations

import numpy as np
import pytest

from live_server import MODEL_ID

PROMPT = "The capital of France is"


def post(server, body: dict) -> dict:
    with server.http() as http:
        resp = http.post("/v1/completions", json={"temperature": 0, **body})
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]


def log_softmax_scores(engine, ids: list[int]) -> list[float]:
    """Token ``j``'s log p under position ``j - 1``'s logits of one ``Engine.logits`` pass."""
    x = engine.logits(ids).astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logz = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return [float(x[j - 1, ids[j]] - logz[j - 1]) for j in range(1, len(ids))]


def test_echo_text_is_the_prompt_then_the_completion(server):
    plain = post(server, {"prompt": PROMPT, "max_tokens": 6})
    echoed = post(server, {"prompt": PROMPT, "max_tokens": 6, "echo": True})
    assert echoed["text"] == PROMPT + plain["text"] and plain["text"]
    assert echoed["logprobs"] is None


def test_prompt_logprobs_are_the_engines_log_softmax(server):
    ids = server.engine.tokenizer.encode(PROMPT)
    got = post(server, {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 0})
    lp = got["logprobs"]
    assert got["text"] == PROMPT and got["finish_reason"] == "length"
    assert len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None
    want = log_softmax_scores(server.engine, ids)
    assert np.allclose(lp["token_logprobs"][1:], want, atol=1e-5, rtol=0)
    assert lp["top_logprobs"][0] is None and all(t == {} for t in lp["top_logprobs"][1:])


def test_max_tokens_0_generates_nothing(server):
    got = post(server, {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1})
    with server.http() as http:
        usage = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 0,
                                                   "echo": True}).json()["usage"]  # fmt: skip
    assert got["text"] == PROMPT and usage["completion_tokens"] == 0
    assert usage["prompt_tokens"] == len(got["logprobs"]["tokens"])


def test_a_token_id_prompt_is_echoed_as_its_text(server):
    ids = server.engine.tokenizer.encode(PROMPT)
    got = post(server, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert got["text"] == server.engine.tokenizer.decode(ids) == PROMPT
    assert np.allclose(got["logprobs"]["token_logprobs"][1:],
                       log_softmax_scores(server.engine, ids), atol=1e-5, rtol=0)  # fmt: skip


@pytest.mark.parametrize("top", [1, 3, 5])
def test_top_logprobs_sizes_and_offsets(server, top):
    got = post(server, {"prompt": PROMPT, "max_tokens": 4, "echo": True, "logprobs": top})
    lp, text = got["logprobs"], got["text"]
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    assert len(lp["tokens"]) == n_prompt + 4 and text.startswith(PROMPT)
    assert lp["top_logprobs"][0] is None
    assert all(len(t) == top for t in lp["top_logprobs"][1:])
    offsets = lp["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert offsets[n_prompt] == len(PROMPT)
    for tok, at in zip(lp["tokens"], offsets):
        assert text[at : at + len(tok)] == tok
    # the generated tokens' logprobs are the ones a plain request gets
    plain = post(server, {"prompt": PROMPT, "max_tokens": 4, "logprobs": top})["logprobs"]
    assert lp["token_logprobs"][n_prompt:] == pytest.approx(plain["token_logprobs"], abs=1e-5)


def test_the_openai_client_reads_an_lm_eval_style_loglikelihood(server):
    context, continuation = "The capital of France is", " Paris"
    got = server.client().completions.create(
        model=MODEL_ID, prompt=context + continuation, echo=True, logprobs=1, max_tokens=0
    )
    lp = got.choices[0].logprobs
    assert got.choices[0].text == context + continuation
    ids = server.engine.tokenizer.encode(context + continuation)
    n_ctx = len(server.engine.tokenizer.encode(context))
    want = log_softmax_scores(server.engine, ids)[n_ctx - 1 :]
    assert np.allclose(lp.token_logprobs[n_ctx:], want, atol=1e-5, rtol=0)
    assert lp.text_offset[n_ctx] == len(context)


@pytest.mark.parametrize("max_tokens", [0, 5])
def test_a_streamed_echo_is_the_whole_one(server, max_tokens):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "echo": True, "logprobs": 2,
            "temperature": 0}  # fmt: skip
    whole = post(server, body)
    chunks = list(server.client().completions.create(model=MODEL_ID, stream=True, **body))
    assert chunks[0].choices[0].text == PROMPT and chunks[0].choices[0].logprobs.tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole["text"]
    got: dict[str, list] = {k: [] for k in whole["logprobs"]}
    for c in chunks:
        if c.choices and c.choices[0].logprobs is not None:
            for k in got:
                got[k] += getattr(c.choices[0].logprobs, k)
    assert got == whole["logprobs"]


def test_a_bos_the_tokenizer_added_sits_at_offset_0():
    from powerinfer_rs.server.echo import PromptLogprobs, echo_logprobs

    texts = {1: "<s>", 2: "Hi", 3: " there"}
    prompt = PromptLogprobs([1, 2, 3], [None, -1.0, -2.0], [None, [], []])
    got = echo_logprobs(prompt, lambda i: (texts[i], []), [], len("Hi there"))
    assert got["tokens"] == ["<s>", "Hi", " there"] and got["text_offset"] == [0, 0, 2]
    assert got["token_logprobs"] == [None, -1.0, -2.0]


@pytest.fixture(scope="module")
def slots_server(smol):
    from powerinfer_rs import Engine

    from live_server import LiveServer

    live = LiveServer(Engine(smol, threads=2), parallel=2, cache_mib=8)
    yield live
    live.stop()


def test_echo_beside_slot_generations_keeps_both_exact(slots_server):
    from concurrent.futures import ThreadPoolExecutor

    eng = slots_server.engine
    ids = eng.tokenizer.encode(PROMPT)
    want = log_softmax_scores(eng, ids)
    plain = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
    alone = post(slots_server, plain)["text"]
    echo = {"prompt": PROMPT, "max_tokens": 3, "echo": True, "logprobs": 0}
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: post(slots_server, b), [echo, plain, echo, plain]))
    for g in got[0::2]:
        assert np.allclose(g["logprobs"]["token_logprobs"][1 : len(ids)], want, atol=1e-5, rtol=0)
    assert [g["text"] for g in got[1::2]] == [alone, alone]
    again = post(slots_server, echo)
    assert again == got[0]  # deterministic, the prefix cache's hit included
