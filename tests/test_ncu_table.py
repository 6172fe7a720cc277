"""benchmarks/gpu/ncu_table.py: the per-kernel bandwidth table from Nsight Compute's CSV, on rows
written as ncu 2025 writes them (the program's own output interleaved, thousands separators,
mixed units)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "gpu"))
import ncu_table  # noqa: E402

HEAD = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
    '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
)


def row(i: int, name: str, metric: str, unit: str, value: str) -> str:
    return (
        f'"{i}","1539","python3.12","127.0.0.1","{name}","1","13","(256, 1, 1)","(8, 1, 1)","0",'
        f'"9.0","Command line profiler metrics","{metric}","{unit}","{value}"'
    )


def launch(i: int, name: str, read: str, write: str, time: str, time_unit: str = "ns"):
    return [
        row(i, name, "dram__bytes_read.sum", "byte", read),
        row(i, name, "dram__bytes_write.sum", "Kbyte", write),
        row(i, name, "gpu__time_duration.sum", time_unit, time),
    ]


def test_per_kernel_means_and_bandwidth(tmp_path, capsys):
    lines = ["==PROF== Connected to process 1539", HEAD, "[Q4_0] repeat 1: hybrid 9.0 tok/s"]
    lines += launch(0, "gate_up_q4_0", "4,000,000", "0", "2,000")  # 4 MB in 2 us: 2000 GB/s
    lines += launch(1, "gate_up_q4_0", "2,000,000", "1,000", "2", "us")  # 3 MB in 2 us
    lines += launch(2, "rms_norm", "16,384", "16.384", "1,024")
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(lines) + "\n")
    rows = ncu_table.table(ncu_table.read_launches(path.read_text().splitlines()), 4000.0)
    assert [r["kernel"] for r in rows] == ["gate_up_q4_0", "rms_norm"]  # by total time
    g, n = rows
    assert g["launches"] == 2 and g["us"] == pytest.approx(2.0)
    assert g["read_mb"] == pytest.approx(3.0) and g["write_mb"] == pytest.approx(0.5)
    assert g["gbs"] == pytest.approx(7e6 / 4e-6 / 1e9)  # 7 MB over 4 us
    assert g["share"] == pytest.approx(g["gbs"] / 4000.0)
    assert n["gbs"] == pytest.approx(32768 / 1.024e-6 / 1e9)
    assert ncu_table.main([str(path), "--copy-gbs", "4000"]) == 0
    out = capsys.readouterr().out
    assert "gate_up_q4_0" in out and "44%" in out and "total" in out


def test_not_ncu_output_is_refused(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("hello\n")
    with pytest.raises(SystemExit, match="no CSV rows"):
        ncu_table.main([str(path)])
