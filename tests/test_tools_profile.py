"""``python -m powerinfer_rs.profile`` on synthetic ReLU models (planted power law)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerinfer_rs.stages.profile import main as profile_main

#: A little wider than conftest.SMALL so the planted law is sharper (synthetic model).
SHAPE = dict(dim=128, ffn=256, layers=2, heads=4, kv_heads=2, vocab=300)
TOKENS = 4096


@pytest.fixture(scope="module")
def relu_model(synth_gguf):
    return synth_gguf(activation="relu", **SHAPE)


def _ascii(s: str) -> bool:
    return bool(s) and s.isascii() and s.isprintable()


@pytest.fixture(scope="module")
def random_text(tmp_path_factory, relu_model):
    """Text decoded from uniformly random token ids: many distinct tokens, so the hidden
    states are as varied as the planted law assumes."""
    from powerinfer_rs.loading import load_model

    tok = load_model(relu_model).tokenizer
    rng = np.random.default_rng(7)
    ok = [i for i in range(3, SHAPE["vocab"]) if _ascii(tok.decode([i]))]
    text = tok.decode([int(i) for i in rng.choice(ok, 2 * TOKENS)])
    p = tmp_path_factory.mktemp("text") / "random.txt"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, relu_model, random_text):
    out = tmp_path_factory.mktemp("prof") / "p"
    rc = profile_main(
        [
            "--model", str(relu_model),
            "--corpus", str(random_text),
            "--tokens", str(TOKENS),
            "--out", str(out),
            "--samples",
            "--sample-tokens", "2048",
            "--threads", "1",
            "--quiet",
        ]
    )  # fmt: skip
    assert rc == 0
    return out


def test_profiled_frequencies_match_the_planted_law(profiled):
    """Acceptance (issue 4): the profiled frequencies match the planted ones (synthetic)."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights

    prof = read_profile(profiled)
    assert prof.tokens == TOKENS and prof.n_layers == SHAPE["layers"]
    spec = SynthSpec(**SHAPE, activation="relu")
    planted = SynthWeights(spec)
    for layer in range(spec.layers):
        got = prof.frequencies(layer)
        want = planted.firing_probabilities(layer)
        corr = float(np.corrcoef(got, want)[0, 1])
        assert corr >= 0.9, (layer, corr)
        assert abs(got.mean() - want.mean()) <= 0.03, (layer, got.mean(), want.mean())
        assert np.abs(got - want).mean() <= 0.05, (layer, np.abs(got - want).mean())
        # the planted hot neurons are found hot, the planted cold ones cold
        assert got[want >= 0.5].min() >= 0.25, layer
        cold = want <= np.quantile(want, 0.25)
        assert got[cold].mean() <= 2 * want[cold].mean() + 0.01, layer


def test_profile_files(profiled, relu_model, capsys):
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.loading import load_model

    prof = read_profile(profiled)
    assert prof.model_fingerprint == load_model(relu_model).fingerprint
    assert prof.meta["semantics"] == "relu"
    assert json.loads(prof.meta["corpus"])[0].endswith("random.txt")
    png = (profiled / "activation.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    summary = json.loads((profiled / "summary.json").read_text())
    assert len(summary["layers"]) == SHAPE["layers"]
    for row in summary["layers"]:
        # ~10% active, power law: the top 10% of neurons carry far more than 10%
        assert 0.8 < row["sparsity"] < 0.95
        assert row["top10_share"] > 0.3 and row["top20_share"] > row["top10_share"]


def test_samples_match_the_profile_and_train(profiled, relu_model, tmp_path):
    from powerinfer_rs.formats.samples import load_samples, read_meta
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.predictors import TrainConfig, train_predictors

    meta = read_meta(profiled)
    assert meta["rows"] == [2048, 2048] and meta["complete"]
    assert meta["metadata"]["predictor_input"] == "ffn_norm"
    x, m = load_samples(profiled, 0)
    assert x.shape == (2048, SHAPE["dim"]) and m.shape == (2048, SHAPE["ffn"])
    assert 0.05 < m.mean() < 0.2
    model = load_model(relu_model)
    cfg = TrainConfig()
    cfg.epochs = 4
    pset = train_predictors(
        profiled, tmp_path / "pred.safetensors", model=model, config=cfg, progress=False
    )
    assert sorted(pset.layers) == [0, 1]
    assert (tmp_path / "pred.safetensors").is_file()


def test_threshold_semantics(tmp_path, relu_model, random_text):
    """With --thresholds a neuron counts when |act| >= t; t = the smallest positive float
    is the ReLU count again, a huge t counts nothing."""
    from powerinfer_rs.formats.profile import read_profile
    from powerinfer_rs.formats.thresholds import ThresholdFile, save_thresholds
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.stages.args import NONZERO

    fp = load_model(relu_model).fingerprint
    counts = {}
    for name, t in (("tiny", NONZERO), ("huge", 1e30)):
        tf = save_thresholds(tmp_path / f"{name}.json", ThresholdFile([t, t], model_fingerprint=fp))
        out = tmp_path / name
        argv = ["--model", str(relu_model), "--corpus", str(random_text), "--tokens", "300",
                "--out", str(out), "--thresholds", str(tf), "--no-plot", "--quiet",
                "--samples"]  # fmt: skip
        assert profile_main(argv) == 0
        prof = read_profile(out)
        assert prof.meta["semantics"] == "threshold"
        counts[name] = np.stack(prof.counts)
    relu_out = tmp_path / "relu"
    argv = ["--model", str(relu_model), "--corpus", str(random_text), "--tokens", "300",
            "--out", str(relu_out), "--no-plot", "--quiet"]  # fmt: skip
    assert profile_main(argv) == 0
    np.testing.assert_array_equal(counts["tiny"], np.stack(read_profile(relu_out).counts))
    assert counts["huge"].sum() == 0
    from powerinfer_rs.formats.samples import load_samples

    assert not load_samples(tmp_path / "huge", 1)[1].any()


def test_silu_model_needs_thresholds(synth_gguf, random_text, tmp_path, capsys):
    silu = synth_gguf(activation="silu")
    rc = profile_main(["--model", str(silu), "--corpus", str(random_text), "--out",
                       str(tmp_path / "x"), "--quiet"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "--thresholds" in err and "Traceback" not in err


def test_synthetic_gguf_names_the_llama_cpp_pre_tokenizer(relu_model):
    """synth writes tokenizer.ggml.pre = "gpt-2" (llama.cpp rejects "gpt2"), and our
    tokenizer takes it as the GPT-2 split without a warning."""
    import warnings

    import gguf

    from powerinfer_rs.loading import load_model

    f = gguf.GGUFReader(str(relu_model)).fields["tokenizer.ggml.pre"]
    assert bytes(f.parts[f.data[0]]).decode() == "gpt-2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok = load_model(relu_model).tokenizer
    assert tok.decode(tok.encode("hello world", add_bos=False)) == "hello world"
