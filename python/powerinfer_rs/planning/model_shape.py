"""What the planner needs to know about a model: its config and each tensor's dtype.

A :class:`ModelShape` comes from a loaded model (:meth:`ModelShape.from_model`) or from a config
alone (:meth:`ModelShape.from_config`), so a 70B-shaped plan needs no 40 GB file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ModelFileError
from ..loading.types import BLOCK_LAYOUT, LoadedModel, ModelConfig, expected_shapes, row_bytes

#: The 32-weight format a K-quant's ``down_t`` falls back to when ``dim`` is not a multiple of
#: 256 (llama.cpp's own fallbacks; crates/engine/src/transpose.rs ``k_fallback``).
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


@dataclass
class ModelShape:
    """A model's config, the dtype of each canonical tensor, and its fingerprint."""

    config: ModelConfig
    dtypes: dict[str, str]
    fingerprint: str = ""
    _shapes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._shapes = expected_shapes(self.config)

    @classmethod
    def from_model(cls, model: LoadedModel) -> ModelShape:
        """The shape of a loaded model (dtypes as stored in its file)."""
        return cls(model.config, {n: t.dtype for n, t in model.tensors.items()}, model.fingerprint)

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

    def tensor_bytes(self, name: str) -> int:
        """Bytes of tensor ``name`` in its stored format."""
        rows, cols = self.shape(name)
        return rows * row_bytes(self.dtype(name), cols)

    def down_t_dtype(self, layer: int) -> str:
        """Dtype of the transposed down projection, as the engine's ``transposed_dtype``:
        ``ffn_down``'s own dtype when ``dim`` is a whole number of its blocks, else a K-quant's
        32-weight fallback (:data:`K_FALLBACK`) when that fits, else F16."""
        dt = self.dtype(f"blk.{layer}.ffn_down")
        for cand in (dt, K_FALLBACK.get(dt, dt)):
            if self.config.dim % BLOCK_LAYOUT[cand][0] == 0:
                return cand
        return "F16"

    def neuron_read_bytes(self, layer: int) -> int:
        """Weight bytes of one FFN neuron: its gate row (none for gate-less families) + up
        row + down_t row."""
        d = self.config.dim
        gate = 0 if self.config.no_gate else row_bytes(self.dtype(f"blk.{layer}.ffn_gate"), d)
        return (
            gate
            + row_bytes(self.dtype(f"blk.{layer}.ffn_up"), d)
            + row_bytes(self.down_t_dtype(layer), d)
        )


__all__ = ["ModelShape"]
