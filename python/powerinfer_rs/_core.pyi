"""Type stubs of the Rust extension module."""

import os
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__version__: str

def simd_level() -> str:
    """Which SIMD path the CPU kernels use ("avx2+fma+f16c", "scalar", ...)."""

def measure_read_bandwidth(bytes: int = ..., iters: int = ..., threads: int = ...) -> float:
    """Read bandwidth in GB/s with `threads` threads (0 = all cores)."""

built_with_cuda: bool

def cuda_available() -> bool:
    """Whether a CUDA driver and at least one device are present."""

def cuda_device_count() -> int:
    """Number of CUDA devices (0 without a driver)."""

def read_neuron_table(path: str, n_layers: int, ffn: int) -> list[list[int]]:
    """Hot (GPU) neuron ids per layer of a plan file, validated."""

class Model:
    """Model weights handed over without copies."""

    def __init__(
        self,
        config: dict[str, object],
        tensors: dict[str, tuple[str, int, int, npt.NDArray[np.uint8]]],
    ) -> None: ...
    def tensor_address(self, name: str) -> int: ...
    def gpu_allocation_report(self, plan: str | os.PathLike[str]) -> list[tuple[str, int]]: ...
    @property
    def bytes_per_token(self) -> int: ...
    @property
    def down_t_bytes(self) -> int: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

class Session:
    """A context (KV cache) and thread pool over a Model."""

    def __init__(self, model: Model, threads: int = 0, n_ctx: int = 0) -> None: ...
    def feed(self, tokens: Sequence[int], all_logits: bool = False) -> npt.NDArray[np.float32]: ...
    def set_sparsity(
        self,
        mode: str,
        thresholds: Sequence[float] | None = None,
        predictors: dict[str, object] | None = None,
        predictor_input: str = "ffn_norm",
    ) -> None: ...
    @property
    def sparsity(self) -> str: ...
    @property
    def down_crossover(self) -> float: ...
    def start_profiling(
        self, thresholds: Sequence[float] | None = None, capture: bool = False
    ) -> None: ...
    @property
    def profile_tokens(self) -> int: ...
    def profile_counts(self) -> npt.NDArray[np.int64]: ...
    def stop_profiling(self) -> None: ...
    def take_captured(
        self,
    ) -> list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]]: ...
    def reset(self) -> None: ...
    def truncate(self, n: int) -> None: ...
    @property
    def n_past(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def kv_cache_bytes(self) -> int: ...
