"""Type stubs of the Rust extension module."""

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__version__: str

def decode_slots(
    sessions: Sequence[Session], tokens: Sequence[Sequence[int]]
) -> list[npt.NDArray[np.float32]]: ...
def simd_level() -> str:
    """Which SIMD path the CPU kernels use ("avx2+fma+f16c", "scalar", ...)."""

def numerics() -> str:
    """The quantized products' activations: "int16" (default) or "int8" (POWERINFER_RS_NUMERICS)."""

def measure_read_bandwidth(bytes: int = ..., iters: int = ..., threads: int = ...) -> float:
    """Read bandwidth in GB/s with `threads` threads (0 = all cores)."""

def measure_format_bandwidth(
    dtype: str, bytes: int = ..., iters: int = ..., threads: int = ...
) -> float:
    """GB/s at which `threads` threads run a matvec over weights of `dtype`."""

def measure_rows_bandwidth(
    dtype: str,
    listed: float,
    fire: float,
    bytes: int = ...,
    iters: int = ...,
    threads: int = ...,
) -> float:
    """GB/s of weight bytes the sparse FFN reads by rows (`listed` gate rows, `fire` firing)."""

def measure_dispatch(
    threads: int = ..., rounds: int = ..., idle_us: int = ..., warm: bool = ...
) -> float:
    """Seconds until all of a pool of `threads` threads started a region after `idle_us` idle."""

def probe_storage_reads(
    path: str, block: int, threads: int, seconds: float
) -> tuple[int, float, bool]:
    """Random reads of `block` bytes by `threads` readers: (reads, seconds, direct)."""

def quantize(dtype: str, x: np.ndarray) -> np.ndarray:
    """Encode each row of a 2-D float32 array in ``dtype``: uint8 of shape (rows, row bytes)."""

def dequantize(dtype: str, data: np.ndarray, cols: int) -> np.ndarray:
    """Decode rows of ``cols`` weights in ``dtype`` (2-D uint8) to float32 (rows, cols)."""

built_with_cuda: bool
built_with_emu: bool
"""Whether this build has device="gpu-emu" (the CUDA kernels run on the CPU by the emulator)."""

def cuda_available() -> bool:
    """Whether a CUDA driver and at least one device are present."""

def cuda_device_count() -> int:
    """Number of CUDA devices (0 without a driver)."""

GPU_DTYPES: tuple[str, ...]
"""The weight formats the GPU kernels take ("F32", ..., "Q4_K", "Q5_K", "Q6_K"); a plan putting a
matrix in another format (Q2_K, Q3_K) on the GPU is refused, except those of GPU_UPLOAD_AS."""

GPU_UPLOAD_AS: dict[str, str]
"""The formats converted at upload, each to the GPU format its rows take on the device
({"IQ4_NL": "Q8_0", "IQ4_XS": "Q8_0", "MXFP4": "Q8_0"}; crates/cuda/src/convert.rs): the GPU
holds (and the planner counts) the converted bytes."""

def parse_device(device: str) -> tuple[str, int | None]:
    """``(kind, index)`` of a device name: kind "cpu", "gpu-sim", "gpu-emu" or "cuda", index
    the CUDA ordinal or None. The one grammar (UnsupportedError, its text the engine's)."""

def check_device(device: str) -> str:
    """The canonical name ("cpu", "gpu-sim", "gpu-emu", "cuda:N") of a device this build and
    machine run: UnsupportedError outside the grammar or for gpu-emu without the emulator,
    CudaError for CUDA without support or past the devices found."""

def sparsity_modes() -> list[dict[str, Any]]:
    """The engine's table of which sparsity mode runs where: per mode ``name``, a bool per
    place (``cpu``, ``gpu``, ``moe_cpu``, ``moe_gpu``, ``store``, ``moe_store``),
    ``relu_only`` and ``needs`` (the file it takes, or None)."""

def mode_refusal(mode: str, place: str) -> str | None:
    """Why ``mode`` does not run at ``place`` (the engine's text), or None where it does."""

def read_plan(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The plan file at ``path`` read by the engine's reader (PlanError, naming the file, for
    anything malformed): ``model_fingerprint``, ``n_layers``, ``ffn_dim``, ``bucket``,
    ``context``, ``kv_cache``, ``budget_bytes``, ``gpu_bytes``, ``attention``, ``predictor``,
    ``ffn_buckets``, ``output``, ``predictor_allocations``, ``predictor_ranks``,
    ``gpu_neurons`` (int64 arrays per layer), ``ram_neurons`` (the same, or None) and
    ``json`` (the whole ``plan`` metadata text)."""

SPARSITY_MODES: tuple[str, ...]
KV_CACHE_TYPES: tuple[str, ...]
"""The sparsity mode names the engine accepts ("dense", "exact-relu", "threshold", ...)."""
INPUT_SITES: tuple[str, ...]
MAX_IO_THREADS: int
"""The most reader threads a neuron store (or a storage probe) starts."""

class PowerInferError(Exception): ...
class ModelFileError(PowerInferError, ValueError): ...
class UnsupportedError(PowerInferError, ValueError): ...
class ShapeError(PowerInferError, ValueError): ...
class TokenError(PowerInferError, ValueError): ...
class ContextOverflowError(PowerInferError, ValueError): ...
class PlanError(PowerInferError, ValueError): ...
class VramBudgetError(PowerInferError, MemoryError): ...
class HubError(PowerInferError, ValueError): ...
class CudaError(PowerInferError, RuntimeError): ...
class InternalError(PowerInferError, RuntimeError): ...

class Predictors:
    """Per-layer activation predictors (fc2 transposed once, in Rust); with ``experts`` (one
    ``(layer, expert)`` pair per entry) a mixture of experts' predictors per expert."""

    def __init__(
        self,
        fc1: Sequence[npt.NDArray[np.float16] | npt.NDArray[np.float32]],
        fc2: Sequence[npt.NDArray[np.float16] | npt.NDArray[np.float32]],
        thresholds: Sequence[float],
        input: str = "ffn_norm",
        experts: Sequence[tuple[int, int]] | None = None,
    ) -> None: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def n_expert_predictors(self) -> int: ...
    @property
    def ranks(self) -> list[int]: ...
    @property
    def input(self) -> str: ...

class Plan:
    """A plan file read once and checked against a Model (see Model.load_plan)."""

    path: str
    @property
    def gpu_bytes(self) -> int: ...
    @property
    def budget_bytes(self) -> int: ...
    @property
    def model_fingerprint(self) -> str: ...
    @property
    def context(self) -> int: ...
    @property
    def kv_cache(self) -> str: ...
    @property
    def allocations(self) -> list[tuple[str, int]]: ...
    @property
    def hot_neurons(self) -> list[npt.NDArray[np.int64]]: ...
    @property
    def attention(self) -> list[bool]: ...
    @property
    def output(self) -> bool: ...

class ModelConfig:
    """The model config, declared once in crates/py/src/config.rs: keywords in, fields as
    attributes (type-checked as they are set; 0 = unset for the optional numbers)."""

    FIELDS: tuple[str, ...]
    arch: str
    n_layers: int
    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    rms_eps: float
    rope_theta: float
    rope_style: str
    activation: str
    bos_token_id: int | None
    eos_token_ids: list[int]
    add_bos: bool
    tie_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    qk_norm_full: bool
    sliding_window: int
    swa_pattern: int
    swa_dense_first: bool
    no_rope_step: int
    rope_theta_local: float
    norm_offset: float
    post_norms: bool
    embed_scale: float
    attn_scale: float
    attn_softcap: float
    final_softcap: float
    relu_threshold: float
    up_act: bool
    layer_norm: bool
    learned_pos: bool
    pos_offset: int
    no_gate: bool
    ffn_bias: bool
    out_bias: bool
    parallel: bool
    mla_kv_lora_rank: int
    mla_q_lora_rank: int
    mla_qk_nope: int
    mla_v_head_dim: int
    rope_dims: int
    rope_linear_factor: float
    rope_freq_factors: list[float]
    rope_attn_factor: float
    rope_long_factors: list[float]
    rope_original_context: int
    n_expert: int
    n_expert_used: int
    expert_ffn_dim: int
    shared_ffn_dim: int
    shared_expert_gate: bool
    expert_gating: str
    expert_norm_weights: bool
    expert_weights_scale: float
    router_on_residual: bool
    dense_lead_layers: int
    expert_score_bias: bool
    expert_groups: int
    expert_groups_used: int
    attn_sinks: bool
    expert_bias: bool
    swiglu_limit: float

    def __init__(self, **fields: object) -> None: ...
    def replace(self, **changes: object) -> ModelConfig: ...
    def to_dict(self) -> dict[str, object]: ...
    def validate(self) -> None: ...
    def for_context(self, n_ctx: int) -> ModelConfig: ...
    @property
    def rotary_dims(self) -> int: ...
    @property
    def n_neurons(self) -> int: ...
    @property
    def layer_neurons(self) -> list[int]: ...
    @property
    def layer_routed_neurons(self) -> list[int]: ...
    def global_tensors(self) -> list[tuple[str, int, int, bool]]: ...
    def layer_tensors(self, layer: int | None = None) -> list[tuple[str, int, int, bool]]: ...

class Model:
    """Model weights handed over without copies (or, with ``copy_weights``, the tensors of
    2 MiB or more copied onto huge pages)."""

    def __init__(
        self,
        config: ModelConfig,
        tensors: dict[str, tuple[str, int, int, npt.NDArray[np.uint8]]],
        copy_weights: bool = False,
        interleave_ffn: bool = False,
    ) -> None: ...
    def tensor_address(self, name: str) -> int: ...
    def tensor_layout(self, name: str) -> str: ...
    def load_plan(
        self,
        plan: str | os.PathLike[str],
        fingerprint: str | None = None,
        budget: int | None = None,
    ) -> Plan: ...
    def gpu_allocation_report(
        self, plan: str | os.PathLike[str], fingerprint: str | None = None
    ) -> list[tuple[str, int]]: ...
    @property
    def bytes_per_token(self) -> int: ...
    @property
    def down_t_bytes(self) -> int: ...
    @property
    def down_t_file(self) -> os.PathLike[str] | None: ...
    def map_down_t(self, path: str, fingerprint: str) -> bool: ...
    @property
    def input_copies_bytes(self) -> int: ...
    def input_column_norms(self, layer: int) -> list[npt.NDArray[np.float32]]: ...
    def write_neuron_store(self, path: str, cluster: int, fingerprint: str) -> int: ...
    def open_neuron_store(
        self,
        path: str,
        cache_bytes: int,
        io_threads: int,
        fingerprint: str | None = None,
        read_ahead: bool = False,
    ) -> tuple[int, bool]: ...
    def close_neuron_store(self) -> None: ...
    def neuron_store_load_resident(self, clusters: list[list[int]]) -> int: ...
    def neuron_store_stats(self, reset: bool = False) -> dict[str, object] | None: ...
    @property
    def n_layers(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

class Session:
    """A context (KV cache) and thread pool over a Model. Calls from several threads are
    serialised (each waits, without the GIL, for the one running)."""

    def __init__(
        self, model: Model, threads: int = 0, n_ctx: int = 0, threads_of: Session | None = None
    ) -> None: ...
    def feed(self, tokens: Sequence[int], all_logits: bool = False) -> npt.NDArray[np.float32]: ...
    def decode(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]: ...
    def feed_hidden(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Append tokens; every token's final-norm hidden state, shape (len(tokens), dim)."""
    def kv_snapshot(self, n: int) -> bytes: ...
    def kv_restore(self, data: bytes, n: int) -> None: ...
    @property
    def kv_snapshot_bytes_per_position(self) -> int: ...
    def set_kv_cache(self, precision: str, v: str | None = None) -> None: ...
    @property
    def kv_cache(self) -> str: ...
    @property
    def kv_cache_k(self) -> str: ...
    @property
    def kv_cache_v(self) -> str: ...
    def set_sparsity(
        self,
        mode: str,
        thresholds: Sequence[float] | None = None,
        predictors: Predictors | None = None,
        input_thresholds: Sequence[Sequence[float]] | None = None,
        input_output: float = 0.0,
        input_score: str = "teal",
    ) -> None: ...
    def set_plan(self, plan: Plan | None) -> None: ...
    @property
    def sparsity(self) -> str: ...
    @property
    def down_crossover(self) -> float: ...
    def start_profiling(
        self,
        thresholds: Sequence[float] | None = None,
        capture: bool = False,
        capture_sites: bool = False,
    ) -> None: ...
    def take_sites(
        self,
    ) -> tuple[list[list[npt.NDArray[np.float32]]], npt.NDArray[np.float32]]: ...
    @property
    def profile_tokens(self) -> int: ...
    def profile_counts(self) -> npt.NDArray[np.int64]: ...
    def profile_expert_counts(self) -> npt.NDArray[np.int64] | None: ...
    def stop_profiling(self) -> None: ...
    def take_captured(
        self,
    ) -> list[tuple[npt.NDArray[Any], ...]]: ...
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
    def set_phase_timing(self, on: bool) -> None: ...
    def phase_times(self) -> dict[str, float | int] | None: ...
