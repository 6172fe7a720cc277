"""``python -m powerinfer_rs.calibrate``: per-layer thresholds for sparsity="threshold".

The work is in :mod:`powerinfer_rs.stages.calibrate`; this module is only the entry point."""

from .stages.calibrate import main

if __name__ == "__main__":
    raise SystemExit(main())
