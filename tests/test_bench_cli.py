"""``powerinfer-rs bench`` on the real SmolLM2 file at tiny sizes: its JSON carries a pp and a
tg row with positive, finite figures, and its markdown is a table with those rows."""

from __future__ import annotations

import json
import math

import pytest

from powerinfer_rs.benchmarking import markdown_table, race
from powerinfer_rs.cli import main

TINY = ["--prompt-tokens", "8", "--tokens", "4", "--repeats", "1", "--threads", "1"]


def test_bench_json_has_positive_finite_figures(smol_path, capsys):
    assert main(["bench", "--model", str(smol_path), *TINY, "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = rep["results"]
    assert [r["test"] for r in rows] == ["pp8", "tg4"]
    for r in rows:
        assert r["model"] == smol_path.name and r["mode"] == "dense" and r["threads"] == 1
        assert r["n_tokens"] == int(r["test"][2:])
        assert len(r["samples"]) == 1
        for key in ("tokens_per_second", "cpu_util"):
            assert math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert math.isfinite(r["others_util"]) and r["others_util"] >= 0


def test_bench_markdown_is_a_table(smol_path, capsys):
    assert main(["bench", "--model", str(smol_path), *TINY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| model") and "t/s" in lines[0]
    assert set(lines[1]) <= set("|-:")
    assert len(lines) == 4 and "pp8" in lines[2] and "tg4" in lines[3]


def test_bench_refuses_an_unknown_mode(smol_path):
    with pytest.raises(SystemExit):
        main(["bench", "--model", str(smol_path), *TINY, "--mode", "nonsense"])


def test_race_alternates_and_counts_cpu():
    order: list[str] = []
    runs = race({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    for r in runs["a"] + runs["b"]:
        assert r.wall_s >= 0 and r.cpu_s >= 0 and r.others_cpu_s >= 0
    table = markdown_table([{"x": 1.5, "n": "a"}], [("n", "n", "s"), ("x", "x", ".1f")])
    assert table.splitlines()[2] == "| a | 1.5 |"


def test_three_contenders_rotate_who_starts():
    from powerinfer_rs.benchmarking import alternation

    firsts = [alternation(["a", "b", "c"], r)[0] for r in range(6)]
    middles = [alternation(["a", "b", "c"], r)[1] for r in range(6)]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]
    assert len(set(middles)) == 3


def test_race_runners_keys_and_subprocess_cpu():
    from powerinfer_rs.benchmarking import Runner, race_runners

    class Echo:
        name = "echo"

        def __init__(self):
            self.cpu = 0.0

        def load(self):
            pass

        def run(self, workload):
            self.cpu += 0.5  # as a subprocess's counter would advance
            return workload * 2

        def close(self):
            pass

        def own_cpu(self):
            return self.cpu

    e = Echo()
    assert isinstance(e, Runner)
    runs = race_runners({"x": e}, 21, 2, warmup=1)
    assert [r.value for r in runs["x"]] == [42, 42]
    assert all(r.cpu_s == 0.5 for r in runs["x"])
