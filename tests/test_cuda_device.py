"""CUDA availability from Python: the extension imports and answers without CUDA (no driver, no
GPU, as in CI), and GPU-only checks run only where a device exists."""

from __future__ import annotations

import pytest

from powerinfer_rs import _core

HAS_GPU = _core.cuda_device_count() > 0


def test_device_count_never_raises() -> None:
    n = _core.cuda_device_count()
    assert isinstance(n, int) and n >= 0
    assert _core.cuda_available() == (n > 0)


def test_wheel_is_built_with_cuda_support() -> None:
    # One wheel for every machine: CUDA support is compiled in and loaded lazily.
    assert _core.built_with_cuda is True


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU answer")
def test_no_gpu_here_means_not_available() -> None:
    assert _core.cuda_available() is False
    assert _core.cuda_device_count() == 0


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")
def test_gpu_is_available() -> None:
    assert _core.cuda_available() is True
