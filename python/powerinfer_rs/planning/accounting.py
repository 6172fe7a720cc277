"""Exact GPU memory accounting: every allocation a plan implies, with its size in bytes.

This is the single definition the engine's GPU allocator mirrors: :func:`gpu_allocation` lists
``(name, bytes)`` for each buffer, every size already rounded up to :data:`~.sizes.ALIGN`
(256) bytes, and a plan's GPU total is the sum of that list. The integer program's byte
coefficients are sums of these same lists, so what the solver counts is what gets allocated.

Per layer ``l`` (when placed on the GPU):

* attention: ``attn_norm`` (f32, see :data:`NORM_ELEMENT_BYTES`), ``attn_q``, ``attn_k``,
  ``attn_v``, ``attn_output`` in their stored formats, and the KV cache ``cache_k``,
  ``cache_v``: ``context x kv_dim`` values each at the plan's ``kv_cache`` precisions (keys',
  values'; f16 by default, f32, or ggml's q8_0/q4_0/q4_1 blocks of 32 values); with the
  family's extra vectors (f32, in the order of the layer program): ``attn_norm.bias``
  (LayerNorm), ``attn_{q,k,v}.bias`` (after the matrices), ``attn_q_norm``, ``attn_k_norm``
  (head_dim each), ``attn_sinks`` (n_heads, gpt-oss), ``attn_output.bias``,
  ``post_attention_norm``;
* predictor: ``pred_fc1``, ``pred_fc2`` (see :mod:`.predictor_size`);
* FFN, when the layer has hot neurons: ``ffn_norm`` (f32), the family's ``ffn_norm.bias``,
  ``ffn_up.bias`` (ffn_dim), ``ffn_down.bias``, ``post_ffw_norm`` (f32),
  ``ffn_{gate,up}_exps.bias`` (the layer's neurons, gpt-oss), and ``ffn_hot``,
  which holds the hot neurons in *slabs* of ``bucket`` neurons. A slab is the bucket's gate
  rows, up rows (none for gate-less families) and
  ``down_t`` rows (the down projection transposed, so a neuron's down vector is one contiguous
  row of ``dim`` weights) followed by the bucket's i32 neuron ids, padded to 256 bytes; a partial
  last slab is padded with zero rows to full size. So ``ffn_hot = n_slabs * slab_bytes``
  exactly.

Global: ``output_norm`` (f32, and ``output_norm.bias`` for LayerNorm families), ``output`` and
``output.logits`` (vocab f32) when the output head is on the GPU; and, whenever anything is,
the shared scratch buffers of
:func:`scratch_allocations`. Token embeddings stay in CPU memory (a token reads one row; the row
crosses PCIe).

The engine computes the same list on its own, from its loaded weights and the plan file
(``_core.Model.gpu_allocation_report``, ``Engine.gpu_allocation_report``, Rust
``powerinfer_cuda::alloc_plan``); ``tests/test_gpu_allocation_report.py`` checks the two agree
name for name and byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import PlanError
from ..loading.types import LoadedModel
from .model_shape import ModelShape
from .placement import Placement
from .predictor_size import PredictorSizes
from .sizes import align

if TYPE_CHECKING:
    from ..formats.plan import Plan

Allocation = tuple[str, int]

#: The KV cache's precisions (``kv_cache``: f16 by default, as llama.cpp's, f32, or ggml's
#: 32-value blocks), one setting for the CPU and the GPU layers: (values, bytes) per block.
KV_BLOCKS = {"f16": (1, 2), "f32": (1, 4), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20)}
#: Bytes of a neuron id stored in a slab (i32).
NEURON_ID_BYTES = 4
#: Bytes per element of an RMSNorm weight on the GPU: the engine keeps norms as f32 whatever
#: their stored format (an F16/BF16 checkpoint's too), and its ``rms_norm`` kernel reads f32.
NORM_ELEMENT_BYTES = 4
#: Bytes of an f32 vector element (biases, activations, logits, scratch).
F32_BYTES = 4

_ATTN_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
_ATTN_MATRICES = _ATTN_TENSORS[1:]


def norm_bytes(shape: ModelShape) -> int:
    """Bytes of one RMSNorm weight on the GPU (``dim`` f32), before alignment."""
    return NORM_ELEMENT_BYTES * shape.config.dim


def kv_dim(shape: ModelShape) -> int:
    """Width of one K (or V) row: ``n_kv_heads * head_dim``."""
    return shape.config.n_kv_heads * shape.config.head_dim


def kv_latent(shape: ModelShape) -> bool:
    """Whether the values are read from the key rows (DeepSeek's latent attention: one row
    of ``kv_lora_rank + rope dims`` per position and layer, no value rows)."""
    return bool(getattr(shape.config, "mla_kv_lora_rank", 0))


def kv_types(kv_cache: str) -> tuple[str, str]:
    """The keys' and the values' precisions of ``kv_cache``: one name for both ("q8_0") or
    "k/v" ("q8_0/f16"); PlanError for an unknown one."""
    k, _, v = str(kv_cache).lower().partition("/")
    v = v or k
    for p in (k, v):
        if p not in KV_BLOCKS:
            raise PlanError(f"kv_cache {kv_cache!r}: choose from {', '.join(KV_BLOCKS)} (or k/v)")
    return k, v


def kv_row_bytes(precision: str, width: int) -> int:
    """Bytes of ``width`` cached values at one precision (whole blocks)."""
    per, nbytes = KV_BLOCKS[precision]
    return width // per * nbytes


def kv_value_bytes(kv_cache: str) -> float:
    """Mean bytes of one cached value, keys and values together (2 at f16; 1.0625 at q8_0)."""
    k, v = kv_types(kv_cache)
    return (kv_row_bytes(k, 32) + kv_row_bytes(v, 32)) / 64


def kv_element_bytes(kv_cache: str) -> float:
    """Bytes of one cached value at ``kv_cache`` (keys and values averaged), as
    :func:`kv_value_bytes`."""
    return kv_value_bytes(kv_cache)


def kv_cache_bytes(shape: ModelShape, context: int, kv_cache: str = "f16", side: str = "k") -> int:
    """Bytes of one layer's K (``side="k"``) or V cache for ``context`` positions at
    ``kv_cache``'s precision for that side, before alignment."""
    k, v = kv_types(kv_cache)
    return context * kv_row_bytes(k if side == "k" else v, kv_dim(shape))


def kv_position_bytes(shape: ModelShape, kv_cache: str = "f16") -> int:
    """Bytes of one position's keys and values in every layer, as the engine's KV snapshot
    holds them (``Session.kv_snapshot_bytes_per_position``)."""
    k, v = kv_types(kv_cache)
    values = 0 if kv_latent(shape) else kv_row_bytes(v, kv_dim(shape))
    return shape.config.n_layers * (kv_row_bytes(k, kv_dim(shape)) + values)


def cpu_kv_bytes(shape: ModelShape, context: int, kv_cache: str = "f16") -> int:
    """Bytes of one layer's CPU KV cache (keys and values) for ``context`` positions: f16 and
    f32 sides as f32 in memory (rounded to f16 at f16), block sides as their blocks."""
    sides = [p if p in ("q8_0", "q4_0", "q4_1") else "f32" for p in kv_types(kv_cache)]
    if kv_latent(shape):
        sides = sides[:1]
    return context * sum(kv_row_bytes(p, kv_dim(shape)) for p in sides)


def _vectors(layer: int | None, items: list[tuple[str, int, bool]]) -> list[Allocation]:
    """f32 vectors ``(name, length)`` of those whose flag is set, named in ``layer``."""
    at = "" if layer is None else f"blk.{layer}."
    return [(at + name, align(F32_BYTES * n)) for name, n, on in items if on]


def attention_allocations(
    shape: ModelShape, layer: int, context: int, kv_cache: str = "f16"
) -> list[Allocation]:
    """Layer ``layer``'s attention weights with the family's biases and norms, and its KV
    cache, in the order the engine uploads them (the steps of its layer program)."""
    c = shape.config
    q_dim, kv = c.n_heads * c.head_dim, kv_dim(shape)

    def matrices(names: tuple[str, ...]) -> list[Allocation]:
        return [
            (f"blk.{layer}.{t}", align(shape.tensor_bytes(f"blk.{layer}.{t}", gpu=True)))
            for t in names
        ]

    out = [(f"blk.{layer}.attn_norm", align(norm_bytes(shape)))]
    out += _vectors(layer, [("attn_norm.bias", c.dim, c.layer_norm)])
    out += matrices(_ATTN_MATRICES[:3])
    out += _vectors(
        layer,
        [
            ("attn_q.bias", q_dim, c.qkv_bias),
            ("attn_k.bias", kv, c.qkv_bias),
            ("attn_v.bias", kv, c.qkv_bias),
            # per head, or over the whole vector (OLMoE)
            ("attn_q_norm", q_dim if c.qk_norm_full else c.head_dim, c.qk_norm),
            ("attn_k_norm", kv if c.qk_norm_full else c.head_dim, c.qk_norm),
            # gpt-oss: a sink logit per query head
            ("attn_sinks", c.n_heads, c.attn_sinks),
        ],
    )
    out += matrices(_ATTN_MATRICES[3:])
    out += _vectors(
        layer,
        [("attn_output.bias", c.dim, c.out_bias), ("post_attention_norm", c.dim, c.post_norms)],
    )
    out += [
        (f"blk.{layer}.cache_{side}", align(kv_cache_bytes(shape, context, kv_cache, side)))
        for side in ("k", "v")
    ]
    return out


def predictor_allocations(pred: PredictorSizes, layer: int) -> list[Allocation]:
    """Layer ``layer``'s predictor weights."""
    names = ("pred_fc1", "pred_fc2") if len(pred.allocations[layer]) == 2 else ("pred",)
    return [(f"blk.{layer}.{n}", align(b)) for n, b in zip(names, pred.allocations[layer])]


def slab_bytes(shape: ModelShape, layer: int, bucket: int) -> int:
    """Bytes of one slab of ``bucket`` hot neurons of ``layer`` (rows in their GPU formats +
    ids, 256-aligned)."""
    return align(bucket * (shape.neuron_read_bytes(layer, gpu=True) + NEURON_ID_BYTES))


def ffn_fixed_allocations(shape: ModelShape, layer: int) -> list[Allocation]:
    """What a layer with any hot neuron allocates besides its slabs: the FFN input norm and the
    family's FFN biases and post-norm (gpt-oss: its experts' gate and up biases over the
    layer's neurons; their down biases stay on the CPU)."""
    c = shape.config
    eb = bool(c.expert_bias) and shape.layer_moe(layer)
    n = shape.layer_neurons(layer)
    return [(f"blk.{layer}.ffn_norm", align(norm_bytes(shape)))] + _vectors(
        layer,
        [
            ("ffn_norm.bias", c.dim, c.layer_norm),
            ("ffn_up.bias", c.ffn_dim, c.ffn_bias),
            ("ffn_down.bias", c.dim, c.ffn_bias),
            ("post_ffw_norm", c.dim, c.post_norms),
            ("ffn_gate_exps.bias", n, eb),
            ("ffn_up_exps.bias", n, eb),
        ],
    )


def ffn_allocations(shape: ModelShape, layer: int, n_slabs: int, bucket: int) -> list[Allocation]:
    """Layer ``layer``'s FFN allocations with ``n_slabs`` slabs on the GPU (none when 0)."""
    if n_slabs <= 0:
        return []
    return ffn_fixed_allocations(shape, layer) + [
        (f"blk.{layer}.ffn_hot", n_slabs * slab_bytes(shape, layer, bucket))
    ]


def output_allocations(shape: ModelShape) -> list[Allocation]:
    """The output head: final norm (f32, with its bias for LayerNorm), output matrix, f32
    logits."""
    return [
        ("output_norm", align(norm_bytes(shape))),
        *_vectors(None, [("output_norm.bias", shape.config.dim, shape.config.layer_norm)]),
        ("output", align(shape.tensor_bytes("output", gpu=True))),
        ("output.logits", align(4 * shape.config.vocab_size)),
    ]


def down_splits(n_hot: int) -> int:
    """Row splits of the GPU's hot down pass over ``n_hot`` slots: one per 128 rows, 1..128
    (``powerinfer_cuda::down_splits``)."""
    return min(128, max(1, n_hot // 128))


#: Fewest positions per chunk of the GPU's decode attention, and most chunks its scratch holds
#: (``powerinfer_cuda::layout::{ATT_MIN_CHUNK, ATT_MAX_CHUNKS}``).
ATT_MIN_CHUNK = 64
ATT_MAX_CHUNKS = 64


def att_part_len(n_heads: int, head_dim: int, context: int) -> int:
    """f32 values of the decode attention's chunk states for ``context`` (flash-decoding: one
    chunk per ``ATT_MIN_CHUNK`` positions, at most ``ATT_MAX_CHUNKS``; with one chunk unused,
    but allocated: every allocation holds bytes) (``powerinfer_cuda::layout::att_part_len``)."""
    chunks = min(ATT_MAX_CHUNKS, max(1, -(-context // ATT_MIN_CHUNK)))
    return n_heads * chunks * (head_dim + 2)


#: Bytes of x quantized for the integer dots per 32 values (``powerinfer_cuda::XQ_BLOCK``).
XQ_BLOCK = 80


def xq_bytes(n: int) -> int:
    """Bytes of ``n`` values quantized for the integer dots (``powerinfer_cuda::layout::xq_bytes``):
    :data:`XQ_BLOCK` per 32, the last block whole."""
    return XQ_BLOCK * -(-n // 32)


def scratch_allocations(shape: ModelShape, context: int, pred: PredictorSizes) -> list[Allocation]:
    """Scratch buffers, allocated once (layers run one after another) when the GPU is used.

    All f32 except ``active`` (i32): residual ``x``, normed ``xb`` and output ``xb2`` (dim
    each); ``q`` (n_heads * head_dim); ``k``, ``v`` (kv_dim each); attention output ``att``
    (n_heads * head_dim); ``hb`` (ffn_dim: the hot neurons' activations); ``active`` (ffn_dim
    i32: one flag per neuron); ``pred`` (the largest predictor rank, its hidden vector); ``xfer``
    (dim: the CPU's partial FFN sum, added on the GPU); ``part`` (dim per split of the hot down
    pass, :func:`down_splits`: its partial sums, added in a fixed order); ``attp`` (the decode
    attention's chunk states for ``context``, :func:`att_part_len`); for families with q/k
    norms ``kn`` (kv_dim: the normed keys); for parallel attention+FFN families (Falcon)
    ``saved`` (dim: the residual before the attention, the FFN's input); for a mixture of
    experts ``expert_w`` (n_expert + 1: the token's weight of each expert, then the shared
    expert's scale). ``hb``, ``active`` and ``part`` count the widest layer's neurons
    (:attr:`.ModelShape.neuron_counts`: a mixture of experts' flattened space, or its leading
    dense layers' ``ffn_dim`` where wider). Then ``xq``, in
    bytes: the input of the quantized row kernels, x quantized to int16 blocks of
    :data:`XQ_BLOCK` bytes per 32 values, for the longer of dim and n_heads * head_dim; and the
    lists compacted on the GPU, a layer's neurons each: ``slots`` (i32: predictor mode's active
    hot slots) with its count ``slots_n`` (one int), ``rows`` and ``rows_a`` (i32, f32: the down
    pass's rows and their activations) with ``rows_n``.
    """
    c = shape.config
    ffn = max(shape.neuron_counts)
    f32 = {
        "x": c.dim,
        "xb": c.dim,
        "xb2": c.dim,
        "q": c.n_heads * c.head_dim,
        "k": kv_dim(shape),
        "v": kv_dim(shape),
        "att": c.n_heads * c.head_dim,
        "hb": ffn,
        "active": ffn,
        "pred": max(pred.ranks, default=0),
        "xfer": c.dim,
        "part": c.dim * down_splits(ffn),
        "attp": att_part_len(c.n_heads, c.head_dim, context),
    }
    if c.qk_norm:
        f32["kn"] = kv_dim(shape)
    if c.parallel:
        f32["saved"] = c.dim
    if c.n_expert:
        f32["expert_w"] = c.n_expert + 1
    xq = xq_bytes(max(c.dim, c.n_heads * c.head_dim))
    tail = {
        "xq": xq,
        "slots": 4 * ffn,
        "slots_n": 4,
        "rows": 4 * ffn,
        "rows_a": 4 * ffn,
        "rows_n": 4,
    }
    return [(f"scratch.{k}", align(4 * n)) for k, n in f32.items()] + [
        (f"scratch.{k}", align(b)) for k, b in tail.items()
    ]


def placement_allocation(
    shape: ModelShape,
    placement: Placement,
    *,
    bucket: int,
    context: int,
    predictors: PredictorSizes,
    kv_cache: str = "f16",
) -> list[Allocation]:
    """Every GPU allocation of ``placement``, layer by layer, then the global ones."""
    if placement.n_layers != shape.config.n_layers:
        raise PlanError(
            f"placement has {placement.n_layers} layers, the model {shape.config.n_layers}"
        )
    out: list[Allocation] = []
    for i in range(placement.n_layers):
        if placement.attention[i]:
            out += attention_allocations(shape, i, context, kv_cache)
        if placement.predictor[i]:
            out += predictor_allocations(predictors, i)
        out += ffn_allocations(shape, i, placement.ffn_buckets[i], bucket)
    if placement.output:
        out += output_allocations(shape)
    if placement.uses_gpu():
        out += scratch_allocations(shape, context, predictors)
    return out


def gpu_allocation(plan: Plan, model: LoadedModel | ModelShape) -> list[Allocation]:
    """``[(name, bytes), ...]``: what the engine allocates on the GPU to run ``plan`` on
    ``model``. Raises :class:`PlanError` when the plan does not fit the model's shape."""
    shape = ModelShape.coerce(model)
    c = shape.config
    if len(plan.gpu_neurons) != c.n_layers:
        raise PlanError(f"plan has {len(plan.gpu_neurons)} layers, the model {c.n_layers}")
    if plan.neuron_counts != shape.neuron_counts:
        raise PlanError(
            f"plan is for {plan.neuron_counts} neurons per layer, the model has "
            f"{shape.neuron_counts}"
        )
    return placement_allocation(
        shape,
        plan.placement,
        bucket=plan.bucket,
        context=plan.context,
        predictors=plan.predictors,
        kv_cache=plan.kv_cache,
    )


def total_bytes(allocations: list[Allocation]) -> int:
    """Sum of an allocation list."""
    return sum(b for _, b in allocations)


__all__ = [
    "KV_BLOCKS",
    "NEURON_ID_BYTES",
    "NORM_ELEMENT_BYTES",
    "attention_allocations",
    "ffn_allocations",
    "ffn_fixed_allocations",
    "gpu_allocation",
    "cpu_kv_bytes",
    "kv_cache_bytes",
    "kv_element_bytes",
    "kv_position_bytes",
    "kv_row_bytes",
    "kv_types",
    "kv_value_bytes",
    "norm_bytes",
    "output_allocations",
    "placement_allocation",
    "predictor_allocations",
    "scratch_allocations",
    "slab_bytes",
    "total_bytes",
]
