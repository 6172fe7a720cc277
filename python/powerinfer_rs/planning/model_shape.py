"""What the planner needs to know about a model: its config and each tensor's dtype.

A :class:`ModelShape` comes from a loaded model (:meth:`ModelShape.from_model`) or from a config
alone (:meth:`ModelShape.from_config`), so a 70B-shaped plan needs no 40 GB file.

A mixture of experts is planned over each layer's flattened neuron space
(``config.n_neurons``): neuron ``e * expert_ffn + j`` is row j of expert e in the merged
``ffn_{gate,up,down}_exps`` tensors (GGUF's own layout), then the shared expert's neurons
(``ffn_*_shexp``). Its leading dense layers (GLM-4.5's first_k_dense_replace) are planned as a
dense model's, over their own ``ffn_dim`` neurons (:meth:`ModelShape.layer_neurons`). A
neuron's rows are the same kinds as a dense FFN's (gate, up, transposed down), so slabs, byte
accounting and the cost model read them alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import _core
from ..errors import ModelFileError, PlanError
from ..facts import mode_refusal, modes_at
from ..loading.types import BLOCK_LAYOUT, LoadedModel, ModelConfig, expected_shapes, row_bytes

#: The 32-weight format a super-block format's ``down_t`` falls back to when ``dim`` is not a
#: multiple of 256 (llama.cpp's own fallbacks; crates/engine/src/transpose.rs ``k_fallback``).
K_FALLBACK = {
    "Q2_K": "Q4_0",
    "Q3_K": "Q4_0",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "IQ4_XS": "IQ4_NL",
}

#: The formats whose ``down_t`` is re-encoded in another format where its rows fit (the ternary,
#: low-bit and lattice ones in Q8_0: one ternary, Q1_0 or Q2_0 scale cannot hold the source
#: rows' scales a transposed block gathers, NVFP4 and MXFP4 would round each weight twice, and
#: the lattice i-quants have no encoder of ours; crates/engine/src/transpose.rs
#: ``transposed_format``).
TRANSPOSED_FORMAT = {
    "TQ1_0": "Q8_0",
    "TQ2_0": "Q8_0",
    "NVFP4": "Q8_0",
    "MXFP4": "Q8_0",
    "Q1_0": "Q8_0",
    "Q2_0": "Q8_0",
    "IQ2_XXS": "Q8_0",
    "IQ2_XS": "Q8_0",
    "IQ2_S": "Q8_0",
    "IQ3_XXS": "Q8_0",
    "IQ3_S": "Q8_0",
    "IQ1_S": "Q8_0",
    "IQ1_M": "Q8_0",
}

#: The weight formats the GPU kernels take (crates/cuda/src/kernels.rs ``GPU_DTYPES``, exported as
#: ``_core.GPU_DTYPES``); the engine refuses a plan putting a matrix in any other (Q2_K, Q3_K) on
#: the GPU, so the planner keeps those parts on the CPU; the decoded formats (IQ4_NL, IQ4_XS,
#: MXFP4, TQ1_0, TQ2_0, the lattice IQ2_XXS..IQ1_M) and the low-bit ones (NVFP4, Q1_0, Q2_0)
#: go there converted (:data:`GPU_UPLOAD_AS`).
GPU_DTYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q4_K",
    "Q5_K",
    "Q6_K",
)

#: The formats converted at upload to a GPU format (``_core.GPU_UPLOAD_AS``: the table, ternary,
#: Q1_0 and Q2_0 formats to Q8_0, NVFP4 to F16): the GPU holds their rows in that format.
GPU_UPLOAD_AS: dict[str, str] = dict(_core.GPU_UPLOAD_AS)


def gpu_dtype(dtype: str) -> str:
    """The format ``dtype``'s rows take on the GPU (:data:`GPU_UPLOAD_AS`, else itself)."""
    return GPU_UPLOAD_AS.get(dtype, dtype)


#: Parts of a model the GPU may hold: a layer's attention or FFN (hot neurons), the output head.
GPU_PARTS = ("attention", "ffn", "output")


@dataclass
class ModelShape:
    """A model's config, the dtype of each canonical tensor, and its fingerprint."""

    config: ModelConfig
    dtypes: dict[str, str]
    fingerprint: str = ""
    _shapes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._shapes = expected_shapes(self.config)

    @property
    def moe(self) -> bool:
        """Whether the FFN is a mixture of experts."""
        return bool(self.config.n_expert)

    @property
    def expert_ffn(self) -> int:
        """Neurons of each routed expert (0 for a dense FFN)."""
        c = self.config
        return (c.expert_ffn_dim or c.ffn_dim) if self.moe else 0

    @property
    def routed_neurons(self) -> int:
        """The routed experts' neurons of one layer (``n_expert * expert_ffn``; ``ffn_dim``
        for a dense FFN): the first part of :attr:`n_neurons`."""
        return self.config.n_expert * self.expert_ffn if self.moe else self.config.ffn_dim

    @property
    def n_neurons(self) -> int:
        """One layer's neurons as plans count them (``config.n_neurons``): ``ffn_dim``, or the
        routed experts' flattened neurons followed by the shared expert's."""
        return self.config.n_neurons

    def layer_moe(self, layer: int) -> bool:
        """Whether ``layer``'s FFN is a mixture of experts (not one of its leading dense
        layers)."""
        return self.moe and layer >= self.config.dense_lead_layers

    def layer_routed(self, layer: int) -> int:
        """``layer``'s neurons a profile counts: :attr:`routed_neurons` for a layer of experts,
        ``ffn_dim`` for a dense one."""
        return self.routed_neurons if self.layer_moe(layer) else self.config.ffn_dim

    def layer_neurons(self, layer: int) -> int:
        """``layer``'s neurons as plans count them: :attr:`n_neurons` for a layer of experts,
        ``ffn_dim`` for a dense one (``config.layer_neurons``)."""
        return self.n_neurons if self.layer_moe(layer) else self.config.ffn_dim

    @property
    def neuron_counts(self) -> list[int]:
        """:meth:`layer_neurons` of every layer."""
        return [self.layer_neurons(i) for i in range(self.config.n_layers)]

    def layer_shared(self, layer: int) -> int:
        """The shared expert's neurons of ``layer`` (0 for a dense layer or none)."""
        return self.config.shared_ffn_dim if self.layer_moe(layer) else 0

    def ffn_tensor(self, layer: int, kind: str) -> str:
        """The tensor holding ``layer``'s ``kind`` ("gate", "up", "down") rows: ``ffn_gate``,
        or a mixture of experts' merged ``ffn_gate_exps``."""
        return f"blk.{layer}.ffn_{kind}" + ("_exps" if self.layer_moe(layer) else "")

    def shared_tensor(self, layer: int, kind: str) -> str | None:
        """The shared expert's ``kind`` tensor of ``layer``, or None without one."""
        return f"blk.{layer}.ffn_{kind}_shexp" if self.layer_shared(layer) else None

    @classmethod
    def from_model(cls, model: LoadedModel) -> ModelShape:
        """The shape of a loaded model (dtypes as stored in its file). PowerInfer's files hold
        the down projection only transposed (``ffn_down_t``, the same elements): it stands for
        ``ffn_down`` here, in its own format, as the engine reads it."""
        dtypes = {n: t.dtype for n, t in model.tensors.items()}
        for n in [n for n in dtypes if n.endswith(".ffn_down_t")]:
            dtypes.setdefault(n[: -len("_t")], dtypes.pop(n))
        return cls(model.config, dtypes, model.fingerprint)

    @classmethod
    def from_config(
        cls,
        config: ModelConfig,
        weight_dtype: str = "Q4_0",
        *,
        norm_dtype: str = "F32",
        dtypes: dict[str, str] | None = None,
        fingerprint: str = "",
    ) -> ModelShape:
        """A shape from a config: every matrix in ``weight_dtype``, norms in ``norm_dtype``,
        entries of ``dtypes`` overriding single tensors."""
        config.validate()
        out = {}
        for name, (rows, _cols) in expected_shapes(config).items():
            out[name] = norm_dtype if rows == 1 else weight_dtype
        out.update(dtypes or {})
        return cls(config, out, fingerprint)

    @classmethod
    def coerce(cls, model: LoadedModel | ModelShape) -> ModelShape:
        """Accept either a :class:`LoadedModel` or a :class:`ModelShape`."""
        return model if isinstance(model, ModelShape) else cls.from_model(model)

    def dtype(self, name: str) -> str:
        """Dtype of tensor ``name`` (``output`` falls back to ``token_embd`` when tied)."""
        if name in self.dtypes:
            return self.dtypes[name]
        if name == "output" and "token_embd" in self.dtypes:
            return self.dtypes["token_embd"]
        raise ModelFileError(f"model has no tensor {name!r}")

    def shape(self, name: str) -> tuple[int, int]:
        """``(rows, cols)`` of tensor ``name``."""
        return self._shapes[name]

    def tensor_bytes(self, name: str, gpu: bool = False) -> int:
        """Bytes of tensor ``name`` in its stored format (``gpu``: in the format it takes on the
        GPU, :func:`gpu_dtype`)."""
        rows, cols = self.shape(name)
        dt = self.dtype(name)
        return rows * row_bytes(gpu_dtype(dt) if gpu else dt, cols)

    def down_t_dtype(self, layer: int, name: str | None = None) -> str:
        """Dtype of the transposed down projection, as the engine's ``transposed_dtype``:
        ``ffn_down``'s own dtype (an expert's: ``ffn_down_exps``'s; ``name`` another tensor's;
        :data:`TRANSPOSED_FORMAT` for the ternary ones) when ``dim`` is a whole number of its
        blocks, else a K-quant's 32-weight fallback (:data:`K_FALLBACK`) when that fits, else
        F16."""
        dt = self.dtype(name or self.ffn_tensor(layer, "down"))
        for cand in (TRANSPOSED_FORMAT.get(dt, dt), K_FALLBACK.get(dt, dt)):
            if self.config.dim % BLOCK_LAYOUT[cand][0] == 0:
                return cand
        return "F16"

    def gpu_refusal(self, part: str, layer: int = 0) -> str | None:
        """Why the GPU cannot hold ``part`` (``"attention"`` or ``"ffn"`` of ``layer``, or
        ``"output"``), or None when it can: a matrix in a format without GPU kernels (not in
        :data:`GPU_DTYPES`), or, for the FFN, gate and up in different formats (the GPU's fused
        gate/up kernel reads one). As the engine checks a plan (crates/engine placement.rs)."""
        if part == "attention":
            names = [f"blk.{layer}.{t}" for t in ("attn_q", "attn_k", "attn_v", "attn_output")]
            formats = {n: self.dtype(n) for n in names}
        elif part == "ffn":
            names = [self.ffn_tensor(layer, "up")]
            if not self.config.no_gate:
                names.insert(0, self.ffn_tensor(layer, "gate"))
            formats = {n: self.dtype(n) for n in names}
            formats[self.ffn_tensor(layer, "down") + "_t"] = self.down_t_dtype(layer)
        elif part == "output":
            formats = {"output": self.dtype("output")}
        else:
            raise ValueError(f"part {part!r}: one of {', '.join(GPU_PARTS)}")
        refused = [f"{n} is {d}" for n, d in formats.items() if gpu_dtype(d) not in GPU_DTYPES]
        if refused:
            return f"{', '.join(refused)}: no GPU kernels for that format"
        if part == "ffn" and not self.config.no_gate:
            gate, up = formats[names[0]], formats[names[1]]
            if gate != up:
                up_name = names[1].split(".", 2)[-1]
                return f"{names[0]} is {gate} and {up_name} {up}: the GPU reads both in one"
        if part == "ffn" and self.layer_shared(layer):
            return self._shared_refusal(layer)
        return None

    def _shared_refusal(self, layer: int) -> str | None:
        """Why ``layer``'s shared expert cannot share its routed experts' slabs (rows of
        another format: a slab holds one per row kind), or None (the engine's
        ``check_shared``)."""
        ours = [self.dtype(self.shared_tensor(layer, k) or "") for k in ("gate", "up")]
        ours.append(self.down_t_dtype(layer, self.shared_tensor(layer, "down")))
        theirs = [self.dtype(self.ffn_tensor(layer, k)) for k in ("gate", "up")]
        theirs.append(self.down_t_dtype(layer))
        if ours != theirs:
            return (
                f"the shared expert's rows (gate, up, transposed down: {', '.join(ours)}) differ "
                f"in format from the routed experts' ({', '.join(theirs)}): a slab holds one "
                "format per row kind"
            )
        return None

    def neuron_fixed_read_bytes(self, layer: int, sparsity: str) -> int:
        """Bytes of one FFN neuron read every token in ``sparsity`` mode (:data:`SPARSITIES`)
        whether it fires or not: none with predictors (they pick the rows before any is read);
        the gate row with exact-relu (for a gate-less FFN its up row), whose ReLU decides; the
        gate and up rows with thresholds (the rule reads |act(gate)·up|); every row dense."""
        if sparsity not in _core.SPARSITY_MODES:
            raise PlanError(f"sparsity {sparsity!r}: choose one of {', '.join(SPARSITIES)}")
        why = mode_refusal(sparsity, "moe_gpu" if self.moe else "gpu")
        if why:
            raise PlanError(f"sparsity {sparsity!r}: {why}; plan for one of those")
        d = self.config.dim
        up = row_bytes(self.dtype(self.ffn_tensor(layer, "up")), d)
        gate = (
            0 if self.config.no_gate else row_bytes(self.dtype(self.ffn_tensor(layer, "gate")), d)
        )
        if sparsity == "predictor":
            return 0
        if sparsity == "exact-relu":
            return gate or up
        if sparsity == "threshold":
            return gate + up
        return self.neuron_read_bytes(layer)

    def neuron_read_bytes(self, layer: int, gpu: bool = False) -> int:
        """Weight bytes of one FFN neuron: its gate row (none for gate-less families) + up
        row + down_t row (``gpu``: in the formats they take on the GPU, :func:`gpu_dtype`)."""
        d = self.config.dim

        def rb(dt: str) -> int:
            return row_bytes(gpu_dtype(dt) if gpu else dt, d)

        gate = 0 if self.config.no_gate else rb(self.dtype(self.ffn_tensor(layer, "gate")))
        return gate + rb(self.dtype(self.ffn_tensor(layer, "up"))) + rb(self.down_t_dtype(layer))

    def router_read_bytes(self, layer: int) -> int:
        """Bytes a mixture of experts' layer reads per token to route, on the CPU: the router
        (``ffn_gate_inp``) and the shared expert's gate vector; 0 for a dense FFN."""
        if not self.layer_moe(layer):
            return 0
        out = self.tensor_bytes(f"blk.{layer}.ffn_gate_inp")
        if f"blk.{layer}.ffn_gate_inp_shexp" in self._shapes:
            out += self.tensor_bytes(f"blk.{layer}.ffn_gate_inp_shexp")
        return out


#: The FFN sparsity modes a plan is for: those the GPU side runs (the engine's mode table).
SPARSITIES = modes_at("gpu")
#: The modes a mixture of experts' plan is for: those its GPU side runs inside experts.
MOE_SPARSITIES = modes_at("moe_gpu")

__all__ = [
    "GPU_DTYPES",
    "GPU_PARTS",
    "GPU_UPLOAD_AS",
    "K_FALLBACK",
    "TRANSPOSED_FORMAT",
    "MOE_SPARSITIES",
    "SPARSITIES",
    "ModelShape",
    "gpu_dtype",
]
