"""The placement problem as numbers: per-layer bucket masses, byte costs and read volumes.

:func:`build_problem` turns a model shape, an activation profile, a hardware profile and a budget
into a :class:`PlacementProblem`; the ILP (:mod:`.ilp`), the greedy fallback (:mod:`.greedy`)
and the evaluator (:mod:`.cost_model`) all read the same numbers. Byte costs are sums of the
allocation lists of :mod:`.accounting`, so they are exact. Parts the GPU cannot hold (matrices in
a format without GPU kernels, :meth:`.ModelShape.gpu_refusal`) are marked refused: every solver
keeps them on the CPU and the evaluator calls a placement putting them on the GPU infeasible.

A mixture of experts is one flattened neuron space per layer (:attr:`.ModelShape.n_neurons`):
a neuron is read when its expert is routed, so each bucket also carries its *routed* mass (the
expected number of its neurons whose expert a token routes to: the profile's ``expert_count``),
and the neurons are ordered by expected bytes read per token (routing skew and activation
inside the expert together): hot experts first, then hot neurons of warm experts. The shared
expert's neurons (read every token) come first and a layer with hot neurons holds all of them
(the executor runs the shared expert whole on one side). Routing itself stays on the CPU
(:attr:`LayerTerms.router_read`), so such a layer is split whenever the GPU holds any of it.
Its leading dense layers (GLM-4.5's) are a dense model's layers, over their own ``ffn_dim``
neurons (:meth:`.ModelShape.layer_neurons`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import PlanError, ShapeError, VramBudgetError
from ..formats.profile import Profile
from . import accounting as acc
from .hardware_profile import HardwareProfile
from .model_shape import ModelShape
from .predictor_size import PredictorSizes
from .sizes import format_bytes

OBJECTIVES = ("mass", "time")
BUCKET_SIZES = (32, 64, 256)


@dataclass
class LayerTerms:
    """One layer's data. Buckets are in placement order (most frequently active first)."""

    order: np.ndarray  #: neuron ids, most frequently active first (ties: lower id first)
    sizes: np.ndarray  #: neurons per bucket
    counts: np.ndarray  #: activation counts per bucket (sum over its neurons)
    mass: np.ndarray  #: expected active neurons per token per bucket (counts / tokens)
    slab_bytes: int  #: GPU bytes per bucket
    ffn_fixed_bytes: int  #: GPU bytes a layer with any hot neuron adds (ffn_norm)
    attn_bytes: int  #: GPU bytes of attention weights + KV cache
    pred_bytes: int  #: GPU bytes of the predictor
    neuron_read: int  #: weight bytes read per active neuron (gate + up + down_t rows)
    #: of those, the bytes read every token whether the neuron fires or not (the mode's:
    #: :meth:`.ModelShape.neuron_fixed_read_bytes`; 0 with predictors)
    neuron_fixed: int
    attn_weight_read: int  #: attention weight bytes read per token
    attn_read: float  #: attention bytes read per token: weights + mean KV (context / 2 rows)
    pred_read: int  #: predictor bytes read per token
    min_neurons: int  #: m_l: a layer with hot neurons has at least this many
    #: expected neurons per token per bucket whose expert is routed (a mixture of experts;
    #: None: every neuron, as in a dense FFN, which reads its ``neuron_fixed`` rows every token)
    routed: np.ndarray | None = None
    #: bytes read per token on the CPU to route (a mixture of experts; 0 for a dense FFN)
    router_read: int = 0
    #: Why the GPU cannot hold the layer's attention / FFN (a format without GPU kernels,
    #: :meth:`.ModelShape.gpu_refusal`), or None: a refused part stays on the CPU.
    attn_refused: str | None = None
    ffn_refused: str | None = None

    def __post_init__(self) -> None:
        if self.routed is None:
            self.routed = self.sizes.astype(np.float64)

    @property
    def moe(self) -> bool:
        """Whether the layer is a mixture of experts (routed on the CPU)."""
        return self.router_read > 0

    @property
    def attn_gpu(self) -> bool:
        """Whether the GPU may hold the layer's attention."""
        return self.attn_refused is None

    @property
    def ffn_gpu(self) -> bool:
        """Whether the GPU may hold any of the layer's neurons."""
        return self.ffn_refused is None

    @property
    def n_buckets(self) -> int:
        """Buckets in the layer."""
        return int(self.sizes.size)

    @property
    def min_buckets(self) -> int:
        """Fewest buckets holding at least ``min_neurons`` neurons."""
        return int(np.searchsorted(np.cumsum(self.sizes), self.min_neurons) + 1)


@dataclass
class PlacementProblem:
    """Everything a solver needs. Bandwidths in bytes/s, latencies in seconds."""

    shape: ModelShape
    hardware: HardwareProfile
    budget: int
    objective: str
    bucket: int
    context: int
    predictors: PredictorSizes
    layers: list[LayerTerms]
    output_bytes: int  #: GPU bytes of the output head (+ final norm, logits)
    output_read: int  #: output head bytes read per token
    scratch_bytes: int  #: GPU bytes of the shared scratch buffers
    embed_read: int  #: bytes of one embedding row (read on the CPU per token)
    total_counts: int  #: all activation counts of the profile
    output_refused: str | None = None  #: why the GPU cannot hold the output head, or None
    kv_cache: str = "f16"  #: the KV caches' precision ("f16" or "f32")
    sparsity: str = "predictor"  #: the FFN mode the plan is for (what a neuron costs)

    @property
    def output_gpu(self) -> bool:
        """Whether the GPU may hold the output head."""
        return self.output_refused is None

    def refusals(self) -> list[str]:
        """The parts kept on the CPU because the GPU cannot hold them, with the reason."""
        out = []
        for i, lt in enumerate(self.layers):
            for part, why in (("attention", lt.attn_refused), ("ffn", lt.ffn_refused)):
                if why:
                    out.append(f"layer {i} {part}: {why}")
        if self.output_refused:
            out.append(f"output: {self.output_refused}")
        return out

    @property
    def gpu_bw(self) -> float:
        """GPU memory bandwidth, bytes/s (inf when there is no GPU: nothing goes there)."""
        return self.hardware.gpu_mem_bw * 1e9 if self.hardware.has_gpu else float("inf")

    @property
    def cpu_bw(self) -> float:
        """CPU memory bandwidth, bytes/s."""
        return self.hardware.cpu_mem_bw * 1e9

    @property
    def cpu_rows_bw(self) -> float:
        """CPU rate of firing neurons' rows read by index, bytes/s."""
        return self.hardware.rows_bw * 1e9

    @property
    def cpu_gate_bw(self) -> float:
        """CPU rate of gate rows streamed by index whether they fire, bytes/s."""
        return self.hardware.gate_bw * 1e9

    @property
    def pcie_bw(self) -> float:
        """PCIe bandwidth, bytes/s (inf without a GPU)."""
        return self.hardware.pcie_bw * 1e9 if self.hardware.has_gpu else float("inf")

    @property
    def launch(self) -> float:
        """Kernel launch latency, s."""
        return self.hardware.launch_latency_us * 1e-6

    def sync_cost(self) -> float:
        """Cost of a layer split between devices: one sync, the CPU pool's start after idle
        (where measured), plus ``dim`` f32 each way."""
        hw = self.hardware
        lat = (hw.sync_latency_us + hw.cpu_dispatch_us) * 1e-6
        return lat + 2 * 4 * self.shape.config.dim / self.pcie_bw


def min_neurons_for(
    freq_sorted: np.ndarray,
    neuron_read: int,
    hw: HardwareProfile,
    dim: int,
    fixed: int = 0,
    routed_sorted: np.ndarray | None = None,
) -> int:
    """m_l: the fewest hottest neurons whose GPU time saving pays for a split.

    Moving neuron ``i`` (frequency ``p_i``) to the GPU saves ``p_i (r - f) (1/R - 1/G) + q_i f
    (1/S - 1/G)`` seconds per token (``R``, ``S``: the CPU's rates for firing rows and for rows
    streamed whether they fire, :attr:`HardwareProfile.rows_bw` and ``gate_bw``; ``f``: the
    bytes read every token its expert is routed,
    :attr:`LayerTerms.neuron_fixed`; ``q_i``: that share of tokens, 1 for a dense FFN); a
    split layer pays one launch, one sync and ``2 * 4 * dim`` PCIe bytes. Returns the smallest
    ``m`` with the top-``m`` saving at least that, or the whole layer when none does.
    """
    n = int(freq_sorted.size)
    if not hw.has_gpu or hw.gpu_mem_bw <= min(hw.rows_bw, hw.gate_bw):
        return n
    g = 1 / (hw.gpu_mem_bw * 1e9)
    per_fired, per_fixed = 1 / (hw.rows_bw * 1e9) - g, 1 / (hw.gate_bw * 1e9) - g
    lat = hw.launch_latency_us + hw.sync_latency_us + hw.cpu_dispatch_us
    overhead = lat * 1e-6 + 8 * dim / (hw.pcie_bw * 1e9)
    q = 1.0 if routed_sorted is None else routed_sorted
    saved = np.cumsum(freq_sorted * (neuron_read - fixed) * per_fired + q * fixed * per_fixed)
    k = int(np.searchsorted(saved, overhead))  # first index with saved >= overhead
    return max(1, min(n, k + 1))


def build_problem(
    shape: ModelShape,
    profile: Profile,
    hardware: HardwareProfile,
    budget: int,
    *,
    objective: str = "mass",
    bucket: int = 64,
    context: int = 4096,
    predictors: PredictorSizes,
    min_neurons: int | None = None,
    kv_cache: str = "f16",
    sparsity: str = "predictor",
) -> PlacementProblem:
    """Check the inputs fit together and compute the problem's numbers.

    ``min_neurons`` overrides the per-layer m_l (0 or 1 = no minimum beyond one bucket).
    ``sparsity``: the FFN mode the plan is for (:data:`.model_shape.SPARSITIES`), which sets
    what a neuron costs per token: its active rows only with predictors, plus the rows its mode
    reads for every neuron otherwise (the gate with exact-relu: the CPU side reads the gate of
    every cold neuron).
    Raises :class:`ShapeError` when the profile does not fit the model, :class:`PlanError` for
    bad options and :class:`VramBudgetError` for a budget the hardware cannot hold.
    """
    c = shape.config
    _check_inputs(shape, profile, hardware, budget, objective, bucket, context, predictors)
    kv_read = (context / 2) * acc.kv_dim(shape) * acc.kv_element_bytes(kv_cache) * 2
    layers = []
    for i in range(c.n_layers):
        layers.append(_layer_terms(
            shape, profile, hardware, i, bucket=bucket, context=context, kv_cache=kv_cache,
            kv_read=kv_read, predictors=predictors, min_neurons=min_neurons, sparsity=sparsity,
        ))  # fmt: skip
    return PlacementProblem(
        shape=shape,
        hardware=hardware,
        budget=int(budget),
        objective=objective,
        bucket=bucket,
        context=context,
        kv_cache=kv_cache,
        sparsity=sparsity,
        predictors=predictors,
        layers=layers,
        output_bytes=acc.total_bytes(acc.output_allocations(shape)),
        output_read=shape.tensor_bytes("output") + shape.tensor_bytes("output_norm"),
        scratch_bytes=acc.total_bytes(acc.scratch_allocations(shape, context, predictors)),
        embed_read=shape.tensor_bytes("token_embd") // c.vocab_size,
        total_counts=int(sum(int(lt.counts.sum()) for lt in layers)),
        output_refused=shape.gpu_refusal("output"),
    )


def _check_inputs(
    shape: ModelShape,
    profile: Profile,
    hardware: HardwareProfile,
    budget: int,
    objective: str,
    bucket: int,
    context: int,
    predictors: PredictorSizes,
) -> None:
    """The errors of :func:`build_problem`'s inputs: a bad option, a budget the hardware
    cannot hold, a profile or predictor sizes of another shape."""
    c = shape.config
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket <= 0:
        raise PlanError(f"bucket must be a positive integer, got {bucket!r}")
    if context <= 0:
        raise PlanError(f"context must be positive, got {context}")
    if budget < 0:
        raise VramBudgetError(f"budget must not be negative, got {budget}")
    if budget > 0 and not hardware.has_gpu:
        raise VramBudgetError(
            f"hardware {hardware.name!r} has no GPU: only --vram-budget 0 fits, got "
            f"{format_bytes(budget)}"
        )
    if budget > hardware.vram_bytes:
        raise VramBudgetError(
            f"budget {format_bytes(budget)} exceeds the {format_bytes(hardware.vram_bytes)} of "
            f"VRAM of hardware {hardware.name!r}"
        )
    want = [shape.layer_routed(i) for i in range(c.n_layers)]
    if profile.n_layers != c.n_layers or profile.layer_neurons != want:
        raise ShapeError(
            f"the profile has {profile.n_layers} layers x {_counts(profile.layer_neurons)} "
            f"neurons, the model {c.n_layers} x {_counts(want)}"
        )
    if shape.moe and (profile.expert_counts is None or profile.n_expert != c.n_expert):
        raise ShapeError(
            f"the profile counts no routing of the model's {c.n_expert} experts (a profile of a "
            "mixture of experts records blk.N.expert_count); profile this model again"
        )
    if len(predictors.allocations) != c.n_layers:
        raise ShapeError(
            f"predictor sizes for {len(predictors.allocations)} layers, model has {c.n_layers}"
        )


def _counts(counts: list[int]) -> str:
    """Layer neuron counts as a message shows them: one number when they agree."""
    return str(counts[0]) if counts and len(set(counts)) == 1 else str(counts)


def _neuron_order(
    shape: ModelShape, profile: Profile, i: int, r: int, f: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Layer ``i``'s activation counts and tokens routed to each neuron (a mixture of
    experts' shared expert appended, counted every token) and its neurons in placement order:
    by activations (ties: lower id), or for a mixture of experts the shared expert first,
    then by expected bytes read per token (``r`` per active neuron, ``f`` of them per routed
    token), activations, id."""
    tokens = int(profile.tokens)
    shared = shape.layer_shared(i)
    cnt = np.asarray(profile.counts[i], dtype=np.int64)
    ids = np.arange(cnt.size + shared)
    if not shape.layer_moe(i):
        route = np.full(cnt.size, tokens, dtype=np.int64)
        return cnt, route, np.lexsort((ids, -cnt)).astype(np.int64)
    # Tokens routing to each neuron's expert; the shared expert's run every token.
    ec = np.asarray(profile.expert_counts[i], dtype=np.int64)  # type: ignore[index]
    route = np.append(np.repeat(ec, shape.expert_ffn), np.full(shared, tokens))
    cnt = np.append(cnt, np.full(shared, tokens))
    read = cnt * (r - f) + route * f
    first = (ids >= shape.layer_routed(i)).astype(np.int64)
    return cnt, route, np.lexsort((ids, -cnt, -read, -first)).astype(np.int64)


def _layer_terms(
    shape: ModelShape,
    profile: Profile,
    hw: HardwareProfile,
    i: int,
    *,
    bucket: int,
    context: int,
    kv_cache: str,
    kv_read: float,
    predictors: PredictorSizes,
    min_neurons: int | None,
    sparsity: str,
) -> LayerTerms:
    """Layer ``i``'s :class:`LayerTerms`: its buckets in placement order, their masses, and
    the layer's bytes held and read."""
    c = shape.config
    tokens = int(profile.tokens)
    shared = shape.layer_shared(i)
    r = shape.neuron_read_bytes(i)
    f = shape.neuron_fixed_read_bytes(i, sparsity)
    cnt, route, order = _neuron_order(shape, profile, i, r, f)
    sorted_counts = cnt[order]
    starts = np.arange(0, cnt.size, bucket)
    sizes = np.diff(np.append(starts, cnt.size))
    bcounts = np.add.reduceat(sorted_counts, starts)
    broute = np.add.reduceat(route[order], starts) / float(tokens)
    attn_w = sum(shape.tensor_bytes(f"blk.{i}.{t}") for t in acc._ATTN_TENSORS)
    if min_neurons is None:
        q = route[order] / float(tokens)
        m = min_neurons_for(sorted_counts / tokens, r, hw, c.dim, f, q)
    else:
        m = max(1, min(int(min_neurons), cnt.size))
    m = max(m, shared)  # a layer with hot neurons holds its whole shared expert
    return LayerTerms(
        order=order,
        sizes=sizes,
        counts=bcounts,
        mass=bcounts / float(profile.tokens),
        slab_bytes=acc.slab_bytes(shape, i, bucket),
        ffn_fixed_bytes=acc.total_bytes(acc.ffn_fixed_allocations(shape, i)),
        attn_bytes=acc.total_bytes(acc.attention_allocations(shape, i, context, kv_cache)),
        pred_bytes=acc.total_bytes(acc.predictor_allocations(predictors, i)),
        neuron_read=r,
        neuron_fixed=f,
        attn_weight_read=attn_w,
        attn_read=attn_w + kv_read,
        pred_read=predictors.layer_bytes(i),
        min_neurons=m,
        attn_refused=shape.gpu_refusal("attention", i),
        ffn_refused=shape.gpu_refusal("ffn", i),
        routed=broute,
        router_read=shape.router_read_bytes(i),
    )


__all__ = [
    "BUCKET_SIZES",
    "OBJECTIVES",
    "LayerTerms",
    "PlacementProblem",
    "build_problem",
    "min_neurons_for",
]
