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


def test_available_memory_from_meminfo(tmp_path):
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
