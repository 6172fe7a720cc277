"""The ``input`` sparsity mode (TEAL/WINA) against the float64 reference with the same masks on
every projection input, on the batched (prefill, scoring) and the one-token (decode) paths, both
through the input-major kernels and through the dense fallback past the crossover; its
thresholds file and its calibration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, PlanError, UnsupportedError
from powerinfer_rs.formats.input_thresholds import (
    SITES,
    InputThresholds,
    load_input_thresholds,
    save_input_thresholds,
)
from powerinfer_rs.loading import load_model
from powerinfer_rs.stages.calibrate_input import calibrate_input, held_out_input_cost

from _helpers import decode_logits, rel
from reference import _weights, reference_forward

#: The input mode against the float64 reference with the same masks (int16 inputs per group).
REF_RTOL = 2e-3
CROSSOVER_ENV = "POWERINFER_RS_INPUT_CROSSOVER"


def site_matrices(w, i: int, site: str) -> list[np.ndarray]:
    p = f"blk.{i}."
    names = {
        "attn_in": ["attn_q", "attn_k", "attn_v"],
        "attn_out": ["attn_output"],
        "ffn_in": ["ffn_gate", "ffn_up"],
        "down_in": ["ffn_down"],
    }
    if site == "output":
        return [w["output"]]
    return [w[p + n] for n in names[site]]


def column_norms(w, i: int, site: str) -> np.ndarray:
    return np.sqrt(sum((m.astype(np.float64) ** 2).sum(axis=0) for m in site_matrices(w, i, site)))


class Sites:
    """Per-site thresholds at a quantile of the dense reference's scores, and the masks."""

    def __init__(self, model, ids, score: str, share: float, output: bool):
        self.w = _weights(model)
        self.n = model.config.n_layers
        self.score = score
        seen: dict[tuple[int, str], list[np.ndarray]] = {}

        def record(i, site, v):
            seen.setdefault((i, site), []).append(self.scores(i, site, v[1:]))
            return v

        reference_forward(model, ids, site_mask=record)
        self.t = {k: self.gap_threshold(np.concatenate(v), share) for k, v in seen.items()}
        if not output:
            self.t[(self.n, "output")] = 0.0

    @staticmethod
    def gap_threshold(scores: np.ndarray, share: float) -> float:
        """A threshold near the ``share``-quantile, in the middle of a gap between two scores
        at least 1% of it wide: no score lies so near it that the engine's float32 values
        (8e-5 from the float64 reference's) and the reference's would fall on different
        sides."""
        s = np.sort(scores.reshape(-1))
        k = int(share * len(s))
        while k + 1 < len(s) and s[k + 1] - s[k] < 0.01 * s[k + 1]:
            k += 1
        return float(np.float32((s[k] + s[k + 1]) / 2))

    def scores(self, i, site, v):
        s = np.abs(v)
        return s * column_norms(self.w, i, site) if self.score == "wina" else s

    def mask(self, i, site, v):
        t = self.t[(i, site)]
        if t <= 0:
            return v
        keep = self.scores(i, site, v) >= t
        keep[0] = True  # the context's first position (the attention sink) stays dense
        return np.where(keep, v, 0.0)

    def file(self) -> InputThresholds:
        return InputThresholds(
            thresholds=[[self.t[(i, s)] for s in SITES] for i in range(self.n)],
            output=self.t[(self.n, "output")],
            score=self.score,
        )


@pytest.mark.parametrize(
    "dtype,score,output",
    [("f32", "teal", False), ("f32", "wina", True), ("bf16", "teal", True)],
)
@pytest.mark.parametrize("crossover", ["1", "0"])
def test_input_mode_matches_the_masked_reference(
    synth_hf, monkeypatch, dtype, score, output, crossover
):
    # crossover 1: every decode product on the input-major kernels; 0: the dense fallback.
    monkeypatch.setenv(CROSSOVER_ENV, crossover)
    model = load_model(synth_hf(dtype=dtype, activation="silu", ffn=256))
    ids = list(np.random.default_rng(8).integers(0, model.config.vocab_size, 20))
    sites = Sites(model, ids, score, 0.4, output)
    eng = Engine(model, threads=2, sparsity="input", thresholds=sites.file())
    assert eng.sparsity == "input"
    assert eng.input_copies_bytes > 0
    ref, _ = reference_forward(model, ids, site_mask=sites.mask)
    assert rel(eng.logits(ids), ref) <= REF_RTOL
    assert rel(decode_logits(eng, ids), ref) <= REF_RTOL
    dense_ref, _ = reference_forward(model, ids)
    assert rel(ref, dense_ref) > 10 * REF_RTOL  # the masks really dropped inputs
    # The first position is dense.
    assert rel(eng.logits(ids[:1]), dense_ref[:1]) <= REF_RTOL


@pytest.mark.parametrize("dtype", ["Q4_0", "Q4_1", "Q8_0", "Q6_K"])
def test_input_mode_on_block_formats_matches_the_masked_reference(synth_gguf, monkeypatch, dtype):
    """The input-major copies hold the file's own integers and scales: the decode products
    are the masked reference's, with no second quantization (unlike down_t)."""
    monkeypatch.setenv(CROSSOVER_ENV, "1")
    ffn = 256 if dtype.endswith("_K") else 128
    dim = 256 if dtype.endswith("_K") else 64
    model = load_model(synth_gguf(dtype=dtype, activation="silu", ffn=ffn, dim=dim))
    ids = list(np.random.default_rng(9).integers(0, model.config.vocab_size, 16))
    sites = Sites(model, ids, "teal", 0.4, True)
    eng = Engine(model, threads=2, sparsity="input", thresholds=sites.file())
    ref, _ = reference_forward(model, ids, site_mask=sites.mask)
    assert rel(decode_logits(eng, ids), ref) <= REF_RTOL
    assert rel(eng.logits(ids), ref) <= REF_RTOL


def test_thresholds_of_zero_are_the_dense_function(synth_gguf, monkeypatch):
    monkeypatch.setenv(CROSSOVER_ENV, "1")
    model = load_model(synth_gguf(dtype="Q4_1", activation="silu"))
    ids = list(np.random.default_rng(10).integers(0, model.config.vocab_size, 16))
    n = model.config.n_layers
    dense = Engine(model, threads=2)
    zero = Engine(model, threads=2, sparsity="input", thresholds={"thresholds": [[0.0] * 4] * n})
    assert rel(zero.logits(ids), dense.logits(ids)) <= 1e-6
    # Decoding at threshold 0 takes the dense products (nothing to skip): the same function.
    assert rel(decode_logits(zero, ids), decode_logits(dense, ids)) <= 1e-6
    # A tiny threshold goes through the input-major kernels and keeps everything that matters.
    tiny = {"thresholds": [[1e-30] * 4] * n, "output": 1e-30}
    eng = Engine(model, threads=2, sparsity="input", thresholds=tiny)
    assert rel(decode_logits(eng, ids), decode_logits(dense, ids)) <= 1e-3


def test_input_mode_errors(synth_hf):
    model = load_model(synth_hf(dtype="f32", activation="silu"))
    n = model.config.n_layers
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input")
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input", thresholds={"thresholds": [[0.1] * 4]})
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input", thresholds={"thresholds": [[0.1] * 3] * n})
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input", thresholds={"thresholds": [[-1.0] * 4] * n})
    bad_score = {"thresholds": [[0.1] * 4] * n, "score": "magic"}
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input", thresholds=bad_score)
    # A per-layer list is threshold mode's, not the input mode's.
    with pytest.raises(PlanError):
        Engine(model, threads=1, sparsity="input", thresholds=[0.1] * n)


def test_threshold_file_round_trip_and_mode_selection(synth_hf, tmp_path):
    model = load_model(synth_hf(dtype="f32", activation="silu"))
    n = model.config.n_layers
    tf = InputThresholds(
        thresholds=[[0.1, 0.2, 0.3, 0.04]] * n,
        output=0.0,
        score="wina",
        model_fingerprint=model.fingerprint,
        target_sparsity=0.4,
    )
    path = save_input_thresholds(tmp_path / "t.json", tf)
    back = load_input_thresholds(path, model)
    assert back.thresholds == tf.thresholds and back.score == "wina"
    # The file selects the input mode by itself (said once).
    with pytest.warns(UserWarning, match="sparsity"):
        eng = Engine(model, threads=1, thresholds=str(path))
    assert eng.sparsity == "input"
    doc = json.loads(path.read_text())
    doc["thresholds"] = "many"
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelFileError):
        load_input_thresholds(path)
    path.write_text("{ not json")
    with pytest.raises(ModelFileError):
        load_input_thresholds(path)
    other = InputThresholds(thresholds=[[0.1] * 4] * n, model_fingerprint="another")
    with pytest.raises(PlanError):
        other.check_model(model)


def test_the_hybrid_executor_refuses_the_input_mode(synth_gguf, tmp_path):
    from test_hybrid import plan_for

    model = load_model(synth_gguf(dtype="F32", activation="silu"))
    n = model.config.n_layers
    path = plan_for(model, tmp_path / "plan.json", 0.5)
    t = {"thresholds": [[0.1] * 4] * n}
    eng = Engine(model, threads=1, plan=path, device="gpu-sim")
    with pytest.raises(UnsupportedError, match="CPU only"):
        eng.set_sparsity("input", thresholds=t)
    with pytest.raises(UnsupportedError, match="CPU only"):
        Engine(model, threads=1, plan=path, device="gpu-sim", sparsity="input", thresholds=t)


def test_calibration_reaches_its_target_and_reports_the_cost(synth_hf):
    model = load_model(synth_hf(dtype="f32", activation="silu", ffn=256))
    eng = Engine(model, threads=2)
    rng = np.random.default_rng(11)
    ids = list(rng.integers(0, model.config.vocab_size, 192))
    cal = calibrate_input(eng, ids[:128], 0.4, score="wina", window=64, progress=False)
    assert np.allclose(cal.below, 0.4, atol=0.03)
    assert cal.thresholds.target_sparsity == 0.4 and cal.thresholds.score == "wina"
    held = held_out_input_cost(eng, ids[128:], cal.thresholds, window=64, progress=False)
    assert held.ppl_input > 0 and held.ppl_dense > 0
    # What the mode dropped on text it was not calibrated on, near the target.
    assert abs(float(np.mean(held.dropped)) - 0.4) < 0.1
    assert eng.sparsity == "dense"


def test_greedy_allocation_meets_the_byte_weighted_target(synth_hf):
    from powerinfer_rs.stages.calibrate_input import site_bytes

    model = load_model(synth_hf(dtype="f32", activation="silu", ffn=256))
    eng = Engine(model, threads=2)
    ids = list(np.random.default_rng(12).integers(0, model.config.vocab_size, 128))
    cal = calibrate_input(
        eng, ids, 0.3, score="teal", window=64, allocation="greedy", progress=False
    )
    shares = np.array(cal.thresholds.thresholds) > 0
    nbytes = site_bytes(eng)
    assert nbytes.shape == (model.config.n_layers, 4) and (nbytes > 0).all()
    # The shares actually dropped, weighted by the sites' bytes, reach the target.
    below = np.array(cal.below)
    assert (below * nbytes).sum() / nbytes.sum() >= 0.3 - 0.03
    assert shares.any() and not np.allclose(below, below.flat[0])  # not one uniform share
    # One share per kind of site, the same in every layer.
    t = np.array(cal.thresholds.thresholds)
    assert ((t > 0) == (t[0] > 0)).all()
    with pytest.raises(Exception, match="allocation"):
        calibrate_input(eng, ids, 0.3, allocation="random", progress=False)


def test_calibrate_cli_input_mode(synth_hf, tmp_path, capsys):
    from powerinfer_rs.stages.calibrate import main

    path = synth_hf(dtype="f32", activation="silu", ffn=256)
    corpus = tmp_path / "text.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "in.json"
    rc = main(
        [
            "--model", str(path), "--corpus", str(corpus), "--tokens", "600",
            "--mode", "input", "--sparsity", "0.3", "--out", str(out), "--window", "64",
            "--quiet", "--threads", "2",
        ]
    )  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "held-out" in text and "attn_in" in text
    tf = load_input_thresholds(out, load_model(path))
    assert tf.score == "wina" and tf.target_sparsity == 0.3
    assert "perplexity_input" in tf.extra


def test_evaluate_lists_the_input_mode_beside_dense(synth_hf, tmp_path, capsys):
    from powerinfer_rs.stages.evaluate import main

    path = synth_hf(dtype="f32", activation="silu", ffn=256)
    model = load_model(path)
    n = model.config.n_layers
    tf = InputThresholds(thresholds=[[0.05, 0.05, 0.05, 0.01]] * n, score="teal")
    t = save_input_thresholds(tmp_path / "in.json", tf)
    text = tmp_path / "text.txt"
    text.write_text("Pack my box with five dozen liquor jugs. " * 100)
    rc = main(
        ["--model", str(path), "--text", str(text), "--tokens", "200", "--window", "64",
         "--input-thresholds", str(t), "--quiet"]
    )  # fmt: skip
    assert rc == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "|" in line]
    assert any(r.split("|")[0].strip() == "input" for r in rows)
    assert any(r.split("|")[0].strip() == "dense" for r in rows)
