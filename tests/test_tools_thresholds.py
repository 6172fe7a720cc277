"""Threshold files (powerinfer_rs.formats.thresholds) and the corpus reader of the tools."""

from __future__ import annotations

import json

import pytest

from powerinfer_rs.errors import ModelFileError, PlanError
from powerinfer_rs.formats.thresholds import (
    FORMAT,
    ThresholdFile,
    load_thresholds,
    main,
    save_thresholds,
)
from powerinfer_rs.stages.corpus import CorpusError, html_to_text, read_corpus


class _Cfg:
    n_layers = 2


class _Model:
    fingerprint = "abc"
    config = _Cfg()


def _tf(**kw) -> ThresholdFile:
    args = dict(
        thresholds=[0.1, 0.25],
        model_fingerprint="abc",
        activation="silu",
        target_sparsity=0.5,
        measured_sparsity=[0.49, 0.51],
        corpus=["a.txt"],
        tokens=100,
    )
    return ThresholdFile(**{**args, **kw})


def test_round_trip(tmp_path):
    p = save_thresholds(tmp_path / "t.json", _tf(extra={"window": 64}))
    doc = json.loads(p.read_text())
    assert doc["format"] == FORMAT and doc["thresholds"] == [0.1, 0.25]
    back = load_thresholds(p, _Model())
    assert back.thresholds == [0.1, 0.25]
    assert back.measured_sparsity == [0.49, 0.51]
    assert back.target_sparsity == 0.5 and back.tokens == 100 and back.corpus == ["a.txt"]
    assert back.activation == "silu" and back.extra == {"window": 64}


def test_minimal_file_is_accepted(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"thresholds": [1, 2]}))
    assert load_thresholds(p, _Model()).thresholds == [1.0, 2.0]


def test_fingerprint_mismatch_is_a_plan_error(tmp_path):
    p = save_thresholds(tmp_path / "t.json", _tf(model_fingerprint="other"))
    with pytest.raises(PlanError, match="another model"):
        load_thresholds(p, _Model())
    p = save_thresholds(tmp_path / "t3.json", _tf(thresholds=[0.1], measured_sparsity=None))
    with pytest.raises(PlanError, match="1 thresholds for a 2-layer"):
        load_thresholds(p, _Model())


@pytest.mark.parametrize(
    "doc, err",
    [
        ("not json", ModelFileError),
        ('{"x": 1}', ModelFileError),
        ('{"thresholds": "a"}', ModelFileError),
        ('{"thresholds": [0.1, "a"]}', ModelFileError),
        ('{"thresholds": [0.1, -1]}', PlanError),
        ('{"thresholds": []}', PlanError),
        ('{"format": "other/1", "thresholds": [1, 1]}', ModelFileError),
        ('{"thresholds": [1, 1], "tokens": -3}', ModelFileError),
    ],
)
def test_malformed_files(tmp_path, doc, err):
    p = tmp_path / "t.json"
    p.write_text(doc)
    with pytest.raises(err):
        load_thresholds(p)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such"):
        load_thresholds(tmp_path / "nope.json")


def test_cli_prints_and_fails_cleanly(tmp_path, capsys):
    p = save_thresholds(tmp_path / "t.json", _tf())
    assert main([str(p)]) == 0
    assert "0.25" in capsys.readouterr().out
    assert main([str(tmp_path / "nope.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


def test_engine_reads_the_file(tmp_path, synth_gguf):
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.runtime.engine import Engine

    path = synth_gguf(activation="silu")
    fp = load_model(path).fingerprint
    t = save_thresholds(tmp_path / "t.json", _tf(model_fingerprint=fp))
    eng = Engine.from_pretrained(path, threads=1, sparsity="threshold", thresholds=t)
    assert eng.sparsity == "threshold" and eng.thresholds == [0.1, 0.25]
    bad = save_thresholds(tmp_path / "b.json", _tf(model_fingerprint="0" * 32))
    with pytest.raises(PlanError):
        Engine.from_pretrained(path, threads=1, sparsity="threshold", thresholds=bad)


# ------------------------------------------------------------------------------ corpus


def test_html_is_stripped(tmp_path):
    page = (
        "<html><head><title>T</title><style>p{}</style></head><body>"
        "<h1>Head</h1><p>First &amp; foremost paragraph.</p><script>x=1</script>"
        "<div>Second block</div></body></html>"
    )
    text = html_to_text(page)
    assert "First & foremost paragraph." in text and "Second block" in text
    assert "x=1" not in text and "p{}" not in text and "<" not in text
    sphinx = (
        '<div role="main"><p>This paragraph is long enough to count as prose, surely.</p>'
        "<pre>code()</pre></div><p>outside the main body, skipped in sphinx pages</p>"
    )
    assert html_to_text(sphinx) == "This paragraph is long enough to count as prose, surely."


def test_read_corpus_files_dirs_and_errors(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("alpha text")
    (tmp_path / "d" / "b.html").write_text("<html><body><p>beta page</p></body></html>")
    (tmp_path / "c.txt").write_text("gamma")
    text, names = read_corpus([tmp_path / "d", tmp_path / "c.txt"])
    assert text.index("alpha") < text.index("beta") < text.index("gamma")
    assert len(names) == 2
    assert read_corpus([tmp_path / "d"], max_chars=5)[0] == "alpha"
    with pytest.raises(CorpusError, match="no such"):
        read_corpus([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("   ")
    with pytest.raises(CorpusError, match="no text"):
        read_corpus([tmp_path / "empty.txt"])
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01\x02" * 10)
    with pytest.raises(CorpusError, match="binary"):
        read_corpus([tmp_path / "bin.txt"])
