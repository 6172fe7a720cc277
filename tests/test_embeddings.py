"""Embeddings: the engine's final hidden states (``Engine.hidden_states``, ``_core.Session.
feed_hidden``) are the rows its logits come from (times the output matrix, in float64 here,
they give the engine's logits); ``Engine.embed`` pools them as numpy does on the same rows
(mean, cls, last) and L2-normalizes; a batch is each input alone, bit for bit; the GGUF's
``pooling_type`` picks the pooling; ``/v1/embeddings`` through the real ``openai`` client
(base64 and float), and its bad requests answered with 400s naming the field."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from live_server import MODEL_ID

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "x"]


def numpy_embedding(hidden: np.ndarray, pooling: str) -> np.ndarray:
    rows = hidden.astype(np.float64)
    v = {"mean": rows.mean(axis=0), "cls": rows[0], "last": rows[-1]}[pooling]
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_hidden_states_times_the_output_matrix_are_the_logits(server):
    from reference import dequantize

    engine = server.engine
    ids = engine.tokenizer.encode(TEXTS[1])
    hidden = engine.hidden_states(ids)
    assert hidden.shape == (len(ids), engine.config.dim) and hidden.dtype == np.float32
    tensors = engine.loaded.tensors
    head = dequantize(tensors.get("output", tensors["token_embd"])).astype(np.float64)
    product = hidden.astype(np.float64) @ head.T
    logits = engine.logits(ids).astype(np.float64)
    # The head's quantized products round x (int16 today: 5.6e-7 measured here; int8 under
    # POWERINFER_RS_NUMERICS=int8), so close to the float64 product, not equal. A state before
    # the output norm, or of another pass, would be off by far more than the bound.
    err = np.abs(product - logits).max() / np.abs(logits).max()
    assert err < 1e-2, err
    assert (product.argmax(axis=1) == logits.argmax(axis=1)).mean() >= 0.9


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooling_is_numpys_on_the_hidden_states(server, pooling):
    engine = server.engine
    got = engine.embed(TEXTS[0], pooling=pooling)
    hidden = engine.hidden_states(engine.tokenizer.encode(TEXTS[0]))
    assert got.shape == (1, engine.config.dim) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], numpy_embedding(hidden, pooling), rtol=1e-6, atol=1e-7)
    assert np.linalg.norm(got[0]) == pytest.approx(1.0, abs=1e-5)
    raw = engine.embed(TEXTS[0], pooling=pooling, normalize=False)[0]
    assert np.linalg.norm(raw) > 2 and np.allclose(raw / np.linalg.norm(raw), got[0], atol=1e-6)


def test_the_poolings_differ_and_the_default_is_mean(server):
    engine = server.engine
    assert engine.loaded.pooling_type is None  # SmolLM2 names none
    out = {p: engine.embed(TEXTS[0], pooling=p)[0] for p in ("mean", "cls", "last")}
    assert np.array_equal(engine.embed(TEXTS[0])[0], out["mean"])
    assert not np.allclose(out["mean"], out["last"]) and not np.allclose(out["cls"], out["last"])


def test_a_batch_is_each_input_alone_bit_for_bit(server):
    engine = server.engine
    engine.generate("Once upon a time", max_new_tokens=4)  # a context the embeddings ignore
    batch = engine.embed(TEXTS)
    alone = np.vstack([engine.embed(t) for t in reversed(TEXTS)])[::-1]
    assert np.array_equal(batch, alone)
    ids = engine.embed([engine.tokenizer.encode(t) for t in TEXTS])
    assert np.array_equal(ids, batch)


def test_engine_embed_refuses_bad_input(server):
    from powerinfer_rs.errors import ContextOverflowError, ShapeError, TokenError

    engine = server.engine
    for bad in ([], "", [""], 3, [1.5], [[]]):
        with pytest.raises((ShapeError, TokenError)):
            engine.embed(bad)
    with pytest.raises(TokenError):
        engine.embed([[10**9]])
    with pytest.raises(ContextOverflowError):
        engine.embed([[1] * (engine.n_ctx + 1)])
    with pytest.raises(Exception, match="rank"):
        engine.embed("hi", pooling="rank")


def test_the_gguf_pooling_type_is_read_and_mapped(smol):
    from powerinfer_rs.loading.gguf_loader import loaded_model
    from powerinfer_rs.runtime.embeddings import model_pooling

    meta = {"general.architecture": "llama", "llama.pooling_type": 2}
    got = loaded_model(smol.path, meta, smol.config, smol.tensors, smol.tokenizer)
    assert got.pooling_type == 2 and model_pooling(got.pooling_type) == "cls"
    assert [model_pooling(t) for t in (None, 0, 1, 2, 3, 4)] == [
        "mean", "mean", "mean", "cls", "last", "rank"
    ]  # fmt: skip


def vector(embedding) -> np.ndarray:
    """An embedding as the client gives it: numbers, or (``encoding_format="base64"`` asked
    for explicitly, which the client leaves alone) little-endian float32 in base64."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.array(embedding, dtype=np.float32)


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_the_openai_client_gets_the_engines_embeddings(server, encoding_format):
    """None: the client asks for base64 itself and decodes it."""
    kw = {} if encoding_format is None else {"encoding_format": encoding_format}
    r = server.client().embeddings.create(model=MODEL_ID, input=TEXTS, **kw)
    want = server.engine.embed(TEXTS)
    assert isinstance(r.data[0].embedding, str) == (encoding_format == "base64")
    got = np.array([vector(d.embedding) for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == MODEL_ID
    assert np.array_equal(got, want)
    n = sum(len(server.engine.tokenizer.encode(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n
    one = server.client().embeddings.create(model=MODEL_ID, input=TEXTS[0], **kw)
    assert np.array_equal(vector(one.data[0].embedding), want[0])
    ids = server.engine.tokenizer.encode(TEXTS[0])
    tokens = server.client().embeddings.create(model=MODEL_ID, input=ids, **kw)
    assert np.array_equal(vector(tokens.data[0].embedding), want[0])


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": ""}, "input", None),
        ({"input": []}, "input", None),
        ({"input": ["a", ""]}, "input", None),
        ({"input": 5}, "input", None),
        ({"input": [1.5]}, "input", None),
        ({"input": [10**9]}, "input", None),
        ({"input": [[1] * 100000]}, "input", "context_length_exceeded"),
        ({"input": "a", "dimensions": 16}, "dimensions", "unsupported_parameter"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", None),
        ({"input": "a", "pooling": "max"}, "pooling", "unknown_parameter"),
        ({"input": "a", "model": "text-embedding-3-small"}, "model", "model_not_found"),
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_field(server, body, param, code):
    with server.http() as http:
        r = http.post("/v1/embeddings", json=body)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err


def test_the_servers_pooling_option_overrides_the_models(server):
    from starlette.testclient import TestClient

    from powerinfer_rs.errors import UnsupportedError
    from powerinfer_rs.server.app import create_app

    app = create_app(server.engine, model_id=MODEL_ID, pooling="last")
    with TestClient(app) as c:
        got = c.post("/v1/embeddings", json={"input": TEXTS[0]}).json()
    want = server.engine.embed(TEXTS[0], pooling="last")[0]
    assert np.array_equal(np.array(got["data"][0]["embedding"], dtype=np.float32), want)
    with pytest.raises(UnsupportedError, match="pooling"):
        create_app(server.engine, model_id=MODEL_ID, pooling="max")
