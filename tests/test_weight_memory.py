"""The choice between the file's memory map and a copy on huge pages (runtime.weight_memory)."""

from __future__ import annotations

import pytest

from powerinfer_rs.errors import ShapeError
from powerinfer_rs.runtime import weight_memory as wm


@pytest.mark.parametrize(
    "text, granted",
    [
        ("always [madvise] never\n", True),
        ("[always] madvise never\n", True),
        ("always madvise [never]\n", False),
    ],
)
def test_huge_pages_read_from_the_selected_mode(tmp_path, text, granted):
    p = tmp_path / "enabled"
    p.write_text(text)
    assert wm.huge_pages_available(p) is granted
    assert wm.huge_pages_available(tmp_path / "absent") is False


def test_available_memory_from_meminfo(tmp_path, monkeypatch):
    monkeypatch.setattr(wm, "cgroup_memory_left", lambda: None)
    p = tmp_path / "meminfo"
    p.write_text("MemTotal:  100 kB\nMemFree:  10 kB\nMemAvailable:   2048 kB\n")
    assert wm.available_memory(p) == 2048 * 1024
    p.write_text("MemTotal:  100 kB\n")
    assert wm.available_memory(p) is None
    p.write_text("MemAvailable: lots\n")
    assert wm.available_memory(p) is None


def test_explicit_choice_wins_and_auto_follows_memory(monkeypatch):
    assert wm.copy_weights(True, 1) is False
    assert wm.copy_weights(False, 10**15) is True
    monkeypatch.setattr(wm, "huge_pages_available", lambda: True)
    monkeypatch.setattr(wm, "available_memory", lambda: 1000)
    assert wm.copy_weights(None, 500) is True
    assert wm.copy_weights(None, 501) is False
    monkeypatch.setattr(wm, "available_memory", lambda: None)
    assert wm.copy_weights(None, 1) is False
    monkeypatch.setattr(wm, "available_memory", lambda: 1000)
    monkeypatch.setattr(wm, "huge_pages_available", lambda: False)
    assert wm.copy_weights(None, 1) is False


@pytest.mark.parametrize("bad", ["no", 1, 0.0, []])
def test_bad_mmap_values_are_shape_errors(bad):
    with pytest.raises(ShapeError, match="mmap"):
        wm.copy_weights(bad, 1)


def test_a_memory_cgroup_limits_the_available_memory(tmp_path, monkeypatch):
    """A limit in the process's memory cgroup (v1 or v2) caps the available memory at what it
    leaves; no limit ("max", or v1's page-rounded LONG_MAX) leaves MemAvailable."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable:   8000000 kB\n")
    v2 = tmp_path / "v2"
    (v2 / "box").mkdir(parents=True)
    (v2 / "box" / "memory.max").write_text("1000000000\n")
    (v2 / "box" / "memory.current").write_text("400000000\n")
    self_v2 = tmp_path / "self_v2"
    self_v2.write_text("0::/box\n")
    assert wm.cgroup_memory_left(self_v2, v2) == 600_000_000
    (v2 / "box" / "memory.max").write_text("max\n")
    assert wm.cgroup_memory_left(self_v2, v2) is None
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.limit_in_bytes").write_text("500000000\n")
    (v1 / "memory" / "job" / "memory.usage_in_bytes").write_text("600000000\n")
    self_v1 = tmp_path / "self_v1"
    self_v1.write_text("12:pids:/job\n9:memory:/job\n1:name=systemd:/\n")
    assert wm.cgroup_memory_left(self_v1, v1) == 0  # over its limit already
    (v1 / "memory" / "job" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert wm.cgroup_memory_left(self_v1, v1) is None
    assert wm.cgroup_memory_left(tmp_path / "missing", v1) is None
    monkeypatch.setattr(wm, "cgroup_memory_left", lambda: 600_000_000)
    assert wm.available_memory(meminfo) == 600_000_000
