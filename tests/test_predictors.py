"""Predictor samples, training (adaptive rank, threshold tuning), file I/O, resumability, CLI.

The accuracy test runs on a synthetic ReLU model (dim 128, ffn 1024, 2 layers, f32 weights:
the smaller conftest shape leaves no useful rank under 10% of its FFN bytes) with samples from
the numpy reference forward pass: x = the FFN input after ffn_norm (recovered exactly from the
gate pre-activations, gate being full column rank) and mask = gate pre-activation > 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, PlanError, ShapeError
from powerinfer_rs.formats.predictors import load_predictors, save_predictors
from powerinfer_rs.formats.samples import SampleWriter, iter_samples, load_samples, read_meta
from powerinfer_rs.loading import load_model
from powerinfer_rs.predictors import (
    LayerPredictor,
    PredictorSet,
    TrainConfig,
    format_table,
    layer_ffn_bytes,
    mask_stats,
    train_layer,
    train_predictors,
    tune_threshold,
)
from powerinfer_rs.predictors import pipeline as pipeline_mod
from powerinfer_rs.predictors._blas import blas_threads

from reference import dequantize, reference_forward

SHAPE = dict(dim=128, ffn=1024, layers=2, heads=4, kv_heads=2, vocab=300)
SEQS, SEQ_LEN, HELD_OUT = 16, 256, 2


def ffn_samples(model, tokens: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer (x = ffn_norm output, mask = gate pre-activation > 0) for ``tokens``."""
    _, gates = reference_forward(model, tokens)
    out = []
    for i, g in enumerate(gates):
        w = dequantize(model.tensors[f"blk.{i}.ffn_gate"]).astype(np.float64)
        x = g @ np.linalg.pinv(w).T  # g = x @ w.T exactly (w has full column rank)
        out.append((x.astype(np.float32), g > 0))
    return out


@pytest.fixture(scope="module")
def relu_data(synth_hf, tmp_path_factory):
    """Synthetic model, a profile dir with train samples, and held-out samples per layer."""
    model = load_model(synth_hf("f32", **SHAPE))
    rng = np.random.default_rng(0)
    prof = tmp_path_factory.mktemp("profile")
    held = [([], []) for _ in range(SHAPE["layers"])]
    meta = {"model_fingerprint": model.fingerprint, "predictor_input": "ffn_norm"}
    w = SampleWriter(prof, SHAPE["layers"], SHAPE["dim"], SHAPE["ffn"], 1000, metadata=meta)
    with blas_threads(1), w:  # small products: one BLAS thread beats many on a busy machine
        for s in range(SEQS):
            per_layer = ffn_samples(model, rng.integers(0, SHAPE["vocab"], SEQ_LEN).tolist())
            for i, (x, m) in enumerate(per_layer):
                if s < SEQS - HELD_OUT:
                    w.add(i, x, m)
                else:
                    held[i][0].append(x)
                    held[i][1].append(m)
    held_out = [(np.concatenate(xs), np.concatenate(ms)) for xs, ms in held]
    return model, prof, held_out


def test_predictors_reach_recall_within_budget(relu_data, tmp_path):
    model, prof, held_out = relu_data
    out = tmp_path / "predictors.safetensors"
    pset = train_predictors(
        prof, out, model=model, recall=0.99, max_bytes_fraction=0.1, progress=False
    )
    total_pred = pset.nbytes()
    total_ffn = sum(layer_ffn_bytes(model, i) for i in range(SHAPE["layers"]))
    assert total_pred <= 0.1 * total_ffn
    for i, (x, m) in enumerate(held_out):
        p = pset.layers[i]
        st = mask_stats(p.predict(x), m)
        assert st.recall >= 0.99, (i, st)
        assert st.precision > st.active_fraction  # better than reading every row
        assert p.stats["rank"] == p.rank and p.stats["met_target"]
        assert p.nbytes("F16") <= 0.1 * layer_ffn_bytes(model, i)
        assert len(p.stats["attempts"]) >= 1
    back = load_predictors(out)
    assert back.model_fingerprint == model.fingerprint and back.recall_target == 0.99
    assert back.input == "ffn_norm" and back.dtype == "F16"
    for i, p in pset.layers.items():
        q = back.layers[i]
        np.testing.assert_array_equal(q.fc1, p.fc1)
        np.testing.assert_array_equal(q.fc2, p.fc2)
        assert q.threshold == p.threshold and q.stats["rank"] == p.rank
        np.testing.assert_array_equal(q.predict(held_out[i][0]), p.predict(held_out[i][0]))
    table = format_table(back)
    assert "recall" in table and "% of FFN bytes" in table
    print("\n" + table)


def test_tune_threshold_exact():
    logits = np.array([[5.0, -1.0, 2.0, 0.5], [3.0, 1.0, -2.0, 4.0]], np.float32)
    true = np.array([[1, 0, 1, 0], [1, 1, 0, 1]], bool)  # positives: 5, 2, 3, 1, 4
    assert tune_threshold(logits, true, 1.0) == 1.0  # keep all five: t = smallest positive
    assert tune_threshold(logits, true, 0.8) == 2.0  # one miss allowed
    assert tune_threshold(logits, true, 0.6) == 3.0
    for r in (1.0, 0.8, 0.6):
        t = tune_threshold(logits, true, r)
        st = mask_stats(logits >= t, true)
        assert st.recall >= r
        # largest: the next positive logit up would break the target
        higher = np.sort(logits[true])[np.sort(logits[true]) > t]
        if higher.size:
            assert mask_stats(logits >= higher[0], true).recall < r
    assert tune_threshold(logits, np.zeros_like(true), 0.99) > logits.max()
    with pytest.raises(ShapeError):
        tune_threshold(logits, true, 0.0)


def _toy(n=400, dim=16, ffn=64, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((ffn, dim))
    b = np.linspace(-2.5, 1.0, ffn)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x[:, 0] = 1.0
    w[:, 0] = b
    return x, (x @ w.T) > 0


def test_train_layer_api_and_errors():
    x, m = _toy()
    cfg = TrainConfig(epochs=5)
    p = train_layer(x, m, recall=0.95, max_rank=8, seed=1, config=cfg)
    assert isinstance(p, LayerPredictor) and p.rank <= 8 and (p.dim, p.ffn) == (16, 64)
    pred = p.predict(x)
    assert pred.dtype == bool and pred.shape == m.shape
    ref = np.maximum(x @ p.fc1.T, 0) @ p.fc2.T >= np.float32(p.threshold)
    np.testing.assert_array_equal(pred, ref)
    np.testing.assert_array_equal(p.fc1, p.fc1.astype(np.float16).astype(np.float32))  # stored f16
    assert p.stats["recall"] >= 0.95 and p.stats["recall_target"] == 0.95
    with pytest.raises(ShapeError):
        train_layer(x[:10], m[:10])
    with pytest.raises(ShapeError):
        train_layer(x, m[:, :3][:5])
    with pytest.raises(PlanError):
        train_layer(x, m, max_bytes=10)  # not even rank 1 fits
    with pytest.raises(ShapeError):
        p.predict(np.zeros((2, 5)))
    # the warm start's ridge: the Gram's sampling-noise scale dim / n unless given
    assert TrainConfig().ridge_for(1536, 4096) == pytest.approx(4096 / 1536)
    assert TrainConfig().ridge_for(10**6, 16) == 1e-3
    assert TrainConfig(ridge=0.5).ridge_for(100, 4096) == 0.5
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ShapeError):
            train_layer(x, m, config=TrainConfig(ridge=bad))


# --------------------------------------------------------------------------- samples
def test_sample_writer_shards_and_readers(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((250, 8)).astype(np.float32)
    m = rng.random((250, 13)) < 0.3
    with SampleWriter(tmp_path, 2, 8, 13, shard_rows=64, metadata={"k": "v"}) as w:
        for a in range(0, 250, 37):
            w.add(1, x[a : a + 37], m[a : a + 37])
        w.add(0, x[0], m[0])  # 1-D = one sample
        assert all(n <= 64 for n in w.buffered_rows)  # bounded buffers
    meta = read_meta(tmp_path)
    assert meta["rows"] == [1, 250] and meta["shards"] == [1, 4] and meta["metadata"] == {"k": "v"}
    shards = sorted((tmp_path / "samples" / "layer_001").glob("shard_*.npz"))
    assert [s.name for s in shards] == [f"shard_{k:05d}.npz" for k in range(4)]
    with np.load(shards[0]) as z:
        assert z["x"].dtype == np.float16 and z["mask"].dtype == np.uint8
        assert z["mask"].shape == (64, 2)  # 13 bits packed into 2 bytes
    xa, ma = load_samples(tmp_path, 1)
    np.testing.assert_array_equal(ma, m)
    np.testing.assert_array_equal(xa, x.astype(np.float16).astype(np.float32))
    batches = list(iter_samples(tmp_path, 1, batch=100))
    assert [b[0].shape[0] for b in batches] == [100, 100, 50]
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), m)
    assert load_samples(tmp_path / "samples", 1, max_rows=70)[0].shape == (70, 8)
    with pytest.raises(ShapeError):
        SampleWriter(tmp_path / "o", 1, 8, 13).add(0, x[:2, :7], m[:2])
    with pytest.raises(ShapeError):
        SampleWriter(tmp_path / "o", 1, 8, 13).add(3, x[:2], m[:2])
    shards[1].write_bytes(b"garbage")
    with pytest.raises(ModelFileError):
        load_samples(tmp_path, 1)
    with pytest.raises(ModelFileError):
        read_meta(tmp_path / "nowhere")
    (tmp_path / "samples" / "meta.json").write_text("{not json")
    with pytest.raises(ModelFileError):
        read_meta(tmp_path)


def test_sample_writer_bounds_what_waits_in_memory(tmp_path):
    """With max_buffered, the fullest layers are written early as shorter shards whenever more
    than that waits: every row still lands, in order, in its own layer."""
    rng = np.random.default_rng(4)
    n_layers, dim, ffn = 40, 16, 24
    row = 2 * dim + 3  # float16 x and the packed mask
    xs = [[] for _ in range(n_layers)]
    ms = [[] for _ in range(n_layers)]
    with SampleWriter(tmp_path, n_layers, dim, ffn, shard_rows=512, max_buffered=50 * row) as w:
        for _ in range(300):
            layer = int(rng.integers(n_layers))
            x = rng.standard_normal((2, dim)).astype(np.float32)
            m = rng.random((2, ffn)) < 0.4
            w.add(layer, x, m)
            xs[layer].append(x)
            ms[layer].append(m)
            assert w.buffered_bytes <= 50 * row
    meta = read_meta(tmp_path)
    assert sum(meta["rows"]) == 600 and max(meta["shards"]) > 1  # early, short shards
    for layer in range(n_layers):
        xa, ma = load_samples(tmp_path, layer)
        if xs[layer]:
            np.testing.assert_array_equal(ma, np.concatenate(ms[layer]))
            want = np.concatenate(xs[layer]).astype(np.float16).astype(np.float32)
            np.testing.assert_array_equal(xa, want)
        else:
            assert xa.shape == (0, dim)


# --------------------------------------------------------------------------- resumability
def _toy_profile(path, layers=3, fingerprint=""):
    with SampleWriter(path, layers, 16, 64, metadata={"model_fingerprint": fingerprint}) as w:
        for i in range(layers):
            x, m = _toy(seed=i)
            w.add(i, x, m)
    return path


def test_resumable_per_layer(tmp_path, monkeypatch):
    prof = _toy_profile(tmp_path / "prof")
    out = tmp_path / "p.safetensors"
    cfg = TrainConfig(epochs=2, min_rank=4)
    calls: list[int] = []
    real = pipeline_mod.train_layer

    def counting(x, m, **kw):
        layer = int(kw["desc"].split()[-1])
        if layer == 2 and "fail" in calls:
            raise KeyboardInterrupt
        calls.append(layer)
        return real(x, m, **kw)

    monkeypatch.setattr(pipeline_mod, "train_layer", counting)
    kw = dict(recall=0.9, max_bytes_fraction=0.5, config=cfg, progress=False)
    calls.append("fail")  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        train_predictors(prof, out, **kw)
    assert calls == ["fail", 0, 1] and not out.exists()
    assert sorted(p.name for p in (tmp_path / "p.safetensors.parts").glob("layer_*")) == [
        "layer_000.safetensors",
        "layer_001.safetensors",
    ]
    calls.clear()
    done = train_predictors(prof, out, **kw)  # resumes: only layer 2 is trained
    assert calls == [2] and sorted(done.layers) == [0, 1, 2]
    assert not (tmp_path / "p.safetensors.parts").exists()
    calls.clear()
    again = train_predictors(prof, out, **kw)  # everything done: nothing trained
    assert calls == [] and sorted(again.layers) == [0, 1, 2]
    np.testing.assert_array_equal(again.layers[1].fc1, done.layers[1].fc1)
    calls.clear()
    other = train_predictors(prof, out, **{**kw, "recall": 0.8}, layers=[1])  # new settings
    assert calls == [1] and sorted(other.layers) == [1]


def test_cli(tmp_path, synth_hf, capsys):
    from powerinfer_rs.stages.train_predictors import build_parser, main

    help_text = build_parser().format_help()
    for flag in (
        "--model",
        "--profile",
        "--recall",
        "--out",
        "--max-bytes-fraction",
        "--layers",
        "--epochs",
        "--seed",
    ):
        assert flag in help_text
    model = load_model(synth_hf("f32"))
    c = model.config
    rng = np.random.default_rng(0)
    with SampleWriter(
        tmp_path / "prof",
        c.n_layers,
        c.dim,
        c.ffn_dim,
        metadata={"model_fingerprint": model.fingerprint},
    ) as w:
        for i in range(c.n_layers):
            x = rng.standard_normal((200, c.dim)).astype(np.float32)
            w.add(i, x, (x @ rng.standard_normal((c.dim, c.ffn_dim))) > 1.0)
    out = tmp_path / "p.safetensors"
    rc = main(
        [
            "--model",
            str(synth_hf("f32")),
            "--profile",
            str(tmp_path / "prof"),
            "--out",
            str(out),
            "--recall",
            "0.9",
            "--max-bytes-fraction",
            "0.3",
            "--epochs",
            "2",
            "--layers",
            "1",
            "--quiet",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "recall" in captured.out and sorted(load_predictors(out).layers) == [1]
    other = load_model(synth_hf("f32", seed=5))
    rc = main(
        [
            "--model",
            str(synth_hf("f32", seed=5)),
            "--profile",
            str(tmp_path / "prof"),
            "--out",
            str(tmp_path / "q.safetensors"),
            "--quiet",
        ]
    )
    assert rc == 2 and other.fingerprint in capsys.readouterr().err  # profiled on another model


# --------------------------------------------------------------------------- file errors
def test_load_predictors_malformed(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x00" * 3)
    with pytest.raises(ModelFileError):
        load_predictors(p)
    p.write_bytes(b"\xff" * 64)
    with pytest.raises(ModelFileError):
        load_predictors(p)
    from safetensors.numpy import save_file

    save_file({"blk.0.fc1": np.zeros((2, 3), np.float32)}, str(p), metadata={"format": "other"})
    with pytest.raises(ModelFileError):
        load_predictors(p)
    meta = {"format": "powerinfer-rs-predictors/1"}
    save_file({"blk.0.fc1": np.zeros((2, 3), np.float32)}, str(p), metadata=meta)
    with pytest.raises(ModelFileError, match="lacks"):
        load_predictors(p)
    for fc1, fc2, match in (
        (np.zeros((2, 3), np.float32), np.zeros((5, 4), np.float32), "do not fit"),
        (np.full((2, 3), np.nan, np.float32), np.zeros((5, 2), np.float32), "non-finite"),
    ):
        layer = {"blk.0.fc1": fc1, "blk.0.fc2": fc2, "blk.0.threshold": np.zeros(1, np.float32)}
        save_file(layer, str(p), metadata=meta)
        with pytest.raises(ModelFileError, match=match):
            load_predictors(p)
    good = PredictorSet({0: LayerPredictor(np.ones((2, 3)), np.ones((5, 2)), 0.5)}, dtype="F32")
    save_predictors(p, good)
    raw = bytearray(p.read_bytes())
    p.write_bytes(bytes(raw[:-8]))  # truncated data
    with pytest.raises(ModelFileError):
        load_predictors(p)
    header = json.loads(bytes(raw[8 : 8 + int.from_bytes(raw[:8], "little")]))
    assert header["__metadata__"]["format"] == "powerinfer-rs-predictors/1"


def test_warm_basis_is_the_truncated_least_squares_map():
    """The warm start's components (float32 normal equations, randomized SVD) against the
    float64 ridge solution's exact truncated SVD, on odd sizes with a spread spectrum."""
    from powerinfer_rs.predictors.train import linear_warm_start, warm_basis

    rng = np.random.default_rng(3)
    n, dim, ffn, k = 611, 37, 53, 6
    x = rng.standard_normal((n, dim)) * np.linspace(3.0, 0.2, dim)
    true = rng.standard_normal((dim, ffn)) * np.geomspace(4.0, 0.01, ffn)
    y = (x @ true + 0.3 * rng.standard_normal((n, ffn))) > 0.4
    t = y * 2.0 - 1.0
    gram = x.T @ x
    gram[np.diag_indices_from(gram)] += 1e-3 * np.trace(gram) / dim + 1e-8
    b = np.linalg.solve(gram, x.T @ t)
    u, s, vt = np.linalg.svd(b, full_matrices=False)
    want = (u[:, :k] * s[:k]) @ vt[:k]
    got = warm_basis(x.astype(np.float32), y, k, seed=1)
    assert got.p.shape == (k, dim) and got.q.shape == (ffn, k)
    approx = got.p.T.astype(np.float64) @ got.q.T.astype(np.float64)
    assert np.linalg.norm(approx - want) <= 1e-3 * np.linalg.norm(want)
    # fc2 @ relu(fc1 @ x) equals the truncated linear map for the paired components
    w1, w2 = linear_warm_start(x, y, 2 * k, rng, got)
    h = np.maximum(x[:5] @ w1.T, 0.0) @ w2.T
    np.testing.assert_allclose(h, x[:5] @ approx, rtol=1e-4, atol=1e-4)
