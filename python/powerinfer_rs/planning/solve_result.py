"""What a solver hands back."""

from __future__ import annotations

from dataclasses import dataclass

from .placement import Placement


@dataclass
class SolveResult:
    """A placement and how it was found."""

    placement: Placement
    solver: str  #: "highs" or "greedy"
    status: str  #: e.g. "optimal", "time limit (feasible)", "greedy"
    objective: float  #: the objective value the solver reports, in the problem's units
    mip_gap: float | None  #: relative MIP gap (None for greedy)
    solve_time_s: float
    note: str = ""

    def to_dict(self) -> dict:
        """JSON-ready summary (without the placement)."""
        return {
            "solver": self.solver,
            "status": self.status,
            "objective": self.objective,
            "mip_gap": self.mip_gap,
            "solve_time_s": self.solve_time_s,
            "note": self.note,
        }


__all__ = ["SolveResult"]
