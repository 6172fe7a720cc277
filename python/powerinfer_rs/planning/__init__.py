"""Neuron placement: which weights live in VRAM, decided by an integer program (HiGHS).

``python -m powerinfer_rs.plan`` is the command line (:mod:`powerinfer_rs.stages.plan`); the
profile it reads and the plan it writes are :mod:`powerinfer_rs.formats.profile` and
:mod:`powerinfer_rs.formats.plan`. The pieces here:

* :mod:`.model_shape`, :mod:`.predictor_size`, :mod:`.hardware_profile` - the inputs
  (hardware profiles in ``hardware/*.json``);
* :mod:`.accounting` - exact GPU bytes (``gpu_allocation``), the allocator's contract;
* :mod:`.problem`, :mod:`.cost_model` - the problem's numbers and the exact evaluation;
* :mod:`.ilp` (HiGHS) and :mod:`.greedy` - the solvers; :mod:`.planner` - ``make_plan``;
* :mod:`.report` - the printed table and the PNG plot (matplotlib).

HiGHS and matplotlib are the ``powerinfer-rs[plan]`` extra; they are imported only when a
solve or a plot needs them. Names are loaded on first use, so importing this package is cheap.
The model is written out in ``planner/README.md``.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "accounting": ["gpu_allocation", "placement_allocation", "total_bytes"],
    "cost_model": ["Evaluation", "evaluate"],
    "hardware_profile": ["HardwareProfile", "list_profiles", "load_hardware"],
    "model_shape": ["ModelShape"],
    "placement": ["Placement"],
    "planner": ["make_plan", "solve"],
    "predictor_size": [
        "PredictorSizes",
        "default_predictor_sizes",
        "fixed_predictor_sizes",
        "read_predictor_sizes",
    ],
    "problem": ["PlacementProblem", "build_problem"],
    "sizes": ["format_bytes", "parse_bytes"],
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
