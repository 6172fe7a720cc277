"""``python -m powerinfer_rs.plan``: neuron placement under a VRAM budget.

The work is in :mod:`powerinfer_rs.stages.plan`; this module is only the entry point."""

from .stages.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
