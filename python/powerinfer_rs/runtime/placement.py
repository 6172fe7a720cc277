"""Placement plans and devices of an :class:`~powerinfer_rs.Engine`: reading and checking a plan,
running its GPU side on "gpu-sim" or "cuda[:N]" (the Rust hybrid executor), and reporting its
device allocations and transfers."""

from __future__ import annotations

import os
import warnings

import numpy as np

from .. import _core
from ..errors import PlanError, VramBudgetError
from .generation import locked


class PlanAndDevice:
    """The plan and device methods of Engine (which sets ``_model``, ``ctx`` (its context),
    ``_n_ctx``, ``device``, ``loaded`` and ``plan``)."""

    @locked
    def load_plan(
        self, plan: str | os.PathLike[str], *, vram_budget: int | str | None = None
    ) -> None:
        """Adopt a placement plan. The Rust core reads the file once and keeps its neuron table;
        it refuses a plan made for another model (PlanError), one whose GPU bytes differ from
        the engine's own allocation list (:meth:`gpu_allocation_report`; PlanError), one over
        ``vram_budget`` or the device's free memory (VramBudgetError), and, on the CPU device,
        one that puts anything on the GPU (VramBudgetError: run it with device="gpu-sim" or on
        a GPU). On a GPU device the plan's GPU side is uploaded; the context is kept."""
        adopted, budget = self._read_plan(plan, vram_budget)
        if self.device != "cpu" and self._n_ctx > adopted.context:
            raise PlanError(
                f"this engine's context of {self._n_ctx} positions is more than the plan's "
                f"{adopted.context} (its GPU KV caches): plan again with --context {self._n_ctx}"
            )
        self._adopt(adopted, budget)

    def _read_plan(
        self, plan: str | os.PathLike[str], vram_budget: int | str | None
    ) -> tuple[_core.Plan, int | None]:
        """Read and check ``plan`` for this model and device; the plan and the budget."""
        from ..planning.sizes import MAX_BUDGET, parse_bytes

        if not isinstance(plan, (str, os.PathLike)):
            raise PlanError(f"plan must be a path, got {type(plan).__name__}")

        budget = None if vram_budget is None else parse_bytes(vram_budget)
        if budget is not None and budget > MAX_BUDGET:
            raise PlanError(
                f"vram_budget={vram_budget!r}: more than any GPU holds (at most "
                f"{MAX_BUDGET >> 40} TiB)"
            )
        if self.device == "cpu" and budget:
            raise VramBudgetError(
                f"the CPU device has no VRAM; vram_budget={vram_budget!r} needs device='gpu-sim' "
                "or 'cuda'"
            )
        adopted = self._model.load_plan(os.fspath(plan), self.loaded.fingerprint, budget)
        if self.device == "cpu" and adopted.gpu_bytes > 0:
            raise VramBudgetError(
                f"{os.fspath(plan)} puts {adopted.gpu_bytes / 2**20:.1f} MiB on the GPU, and "
                "device='cpu' has none: run it with device='gpu-sim' (its GPU side simulated in "
                "host memory) or device='cuda', or plan with --vram-budget 0 for the CPU"
            )
        return adopted, budget

    def _adopt(self, adopted: _core.Plan, budget: int | None) -> None:
        """Hand a checked plan to the session and open its device."""
        self.ctx.session.set_plan(adopted)
        try:
            self.ctx.session.set_device(self.device, budget)
        except BaseException:
            self.ctx.session.set_plan(self.plan)
            if self.plan is not None:
                self.ctx.session.set_device(self.device, None)
            raise
        self.plan = adopted
        self._gpu_unused = None
        if self.device != "cpu" and adopted.gpu_bytes == 0:
            self._gpu_unused = (
                f"the plan puts nothing on the GPU (its budget was {adopted.budget_bytes} bytes), "
                f"so device={self.device!r} runs everything on the CPU; plan again with a larger "
                "--vram-budget to use it"
            )
            warnings.warn(self._gpu_unused, UserWarning, stacklevel=3)

    def gpu_info(self) -> dict | None:
        """The GPU side of the adopted plan, or None on the CPU device: the ``device``
        description, its ``allocations`` ([(name, bytes)], equal to the plan's),
        ``allocated_bytes``, ``free_bytes``/``total_bytes`` of device memory, decode ``steps``
        and per-layer ``transfers`` (uploads, downloads, bytes up, bytes down; the output head
        last), ``kernel_launches`` ({kernel entry: launches}) where the device counts them
        (gpu-emu), else None, and ``graphs`` (with ``POWERINFER_RS_GPU_GRAPHS=1`` on gpu-emu, or
        on cuda with a CUDA 12+ driver: the launch batches run as graphs, {batches, built,
        replayed, nodes_updated, kernels, explicit}), else None. ``unused`` is None, or, on a
        GPU device whose plan puts nothing on it, why the device is idle (the engine warned when
        it adopted the plan)."""
        with self.ctx.lock:
            info = self.ctx.session.gpu_info()
            unused = getattr(self, "_gpu_unused", None)
            if info is not None:
                info["unused"] = None
            elif unused is not None:
                info = {
                    "device": self.device,
                    "unused": unused,
                    "allocations": [],
                    "allocated_bytes": 0,
                    "steps": 0,
                    "transfers": [],
                    "kernel_launches": None,
                    "graphs": None,
                }
            return info

    @property
    def hot_neurons(self) -> list[np.ndarray] | None:
        """Each layer's hot (GPU) neuron ids (int64, ascending) of the adopted plan, or None."""
        return None if self.plan is None else self.plan.hot_neurons

    def gpu_allocation_report(
        self, plan: str | os.PathLike[str] | None = None
    ) -> list[tuple[str, int]]:
        """``[(name, bytes), ...]``: every GPU allocation this engine makes to run ``plan`` (a
        plan file; default: the one loaded), empty for a CPU-only plan. Computed by the Rust
        core from this model's weights and the plan file's neuron table and placement, apart
        from the planner; it equals ``planning.accounting.gpu_allocation(plan, model)`` and
        sums to the plan's ``gpu_bytes``. A plan passed here needs no GPU (the report is host
        arithmetic). Raises :class:`PlanError` when no plan is loaded or given, or the plan is
        unreadable or made for another model."""
        if plan is not None:
            if not isinstance(plan, (str, os.PathLike)):
                raise PlanError(f"plan must be a path, got {type(plan).__name__}")
            return self._model.gpu_allocation_report(os.fspath(plan), self.loaded.fingerprint)
        if self.plan is None:
            raise PlanError("no plan loaded: pass plan=... here or to the Engine")
        return self.plan.allocations


def check_device(device: str) -> str:
    """The canonical name of ``device``: "cpu", "gpu-sim" (a plan's GPU side in host memory,
    each kernel's contract in Rust), "gpu-emu" (the real CUDA kernels run on the CPU by the
    emulator: slow, for checking a plan's kernels without a GPU), or "cuda:N" ("cuda" is
    "cuda:0") when that GPU exists. The grammar and its refusals are the Rust core's
    (``_core.check_device``): UnsupportedError for another name or gpu-emu in a build without
    the emulator, CudaError for a GPU this build or machine does not have."""
    return _core.check_device(device)
