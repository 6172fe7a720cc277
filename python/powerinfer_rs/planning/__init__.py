"""Neuron placement: which weights live in VRAM, decided by an integer program (HiGHS).

``python -m powerinfer_rs.plan`` is the command line; the pieces:

* :mod:`.profile_io` - activation profiles on disk (``read_profile``, ``write_profile``,
  ``synthetic_profile``);
* :mod:`.model_shape`, :mod:`.predictor_size`, :mod:`.hardware_profile` - the inputs;
* :mod:`.accounting` - exact GPU bytes (``gpu_allocation``), the allocator's contract;
* :mod:`.problem`, :mod:`.cost_model` - the problem's numbers and the exact evaluation;
* :mod:`.ilp` (HiGHS) and :mod:`.greedy` - the solvers; :mod:`.planner` - ``make_plan``;
* :mod:`.plan_file` - ``PLAN.safetensors`` (``save_plan``, ``load_plan``);
* :mod:`.report` - the printed table and the PNG plot.

The model is written out in ``planner/README.md``.
"""

from __future__ import annotations

from .accounting import gpu_allocation, placement_allocation, total_bytes
from .cost_model import Evaluation, evaluate
from .hardware_profile import HardwareProfile, list_profiles, load_hardware
from .model_shape import ModelShape
from .placement import Placement
from .plan_file import PLAN_FORMAT, Plan, load_plan, save_plan
from .planner import make_plan, solve
from .predictor_size import (
    PredictorSizes,
    default_predictor_sizes,
    fixed_predictor_sizes,
    read_predictor_sizes,
)
from .problem import PlacementProblem, build_problem
from .profile_io import PROFILE_FORMAT, Profile, read_profile, synthetic_profile, write_profile
from .sizes import format_bytes, parse_bytes

__all__ = [
    "PLAN_FORMAT",
    "PROFILE_FORMAT",
    "Evaluation",
    "HardwareProfile",
    "ModelShape",
    "Placement",
    "PlacementProblem",
    "Plan",
    "PredictorSizes",
    "Profile",
    "build_problem",
    "default_predictor_sizes",
    "evaluate",
    "fixed_predictor_sizes",
    "format_bytes",
    "gpu_allocation",
    "list_profiles",
    "load_hardware",
    "load_plan",
    "make_plan",
    "parse_bytes",
    "placement_allocation",
    "read_predictor_sizes",
    "read_profile",
    "save_plan",
    "solve",
    "synthetic_profile",
    "total_bytes",
    "write_profile",
]
