"""Facts the Rust core owns, asked of ``_core`` and never restated here: which sparsity mode runs
where (``_core.sparsity_modes()``, the engine's one table) and why a mode does not run somewhere
(``_core.mode_refusal``, the engine's own text). The device grammar is ``_core.parse_device`` /
``_core.check_device``.

Places (the table's columns): ``cpu`` (the CPU engine), ``gpu`` (the hybrid executor's GPU
side), ``moe_cpu`` / ``moe_gpu`` (inside the routed experts of a mixture of experts, on the CPU
engine / with a GPU plan), ``store`` / ``moe_store`` (a decoded token's FFN rows read from a
neuron store).
"""

from __future__ import annotations

from . import _core

#: One dict per mode, in ``_core.SPARSITY_MODES`` order: ``name``, a bool per place,
#: ``relu_only`` and ``needs`` (the file the mode takes, or None).
MODE_TABLE: tuple[dict, ...] = tuple(_core.sparsity_modes())


def mode_row(mode: str) -> dict:
    """The table's row of ``mode`` (KeyError for a name the engine does not know)."""
    for row in MODE_TABLE:
        if row["name"] == mode:
            return row
    raise KeyError(mode)


def modes_at(place: str) -> tuple[str, ...]:
    """The modes that run at ``place``, in table order."""
    return tuple(r["name"] for r in MODE_TABLE if r[place])


def mode_refusal(mode: str, place: str) -> str | None:
    """Why ``mode`` does not run at ``place`` (the engine's text), or None where it does."""
    return _core.mode_refusal(mode, place)


__all__ = ["MODE_TABLE", "mode_refusal", "mode_row", "modes_at"]
