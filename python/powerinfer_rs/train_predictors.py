"""``python -m powerinfer_rs.train_predictors``: per-layer activation predictors.

The work is in :mod:`powerinfer_rs.stages.train_predictors`; this module is only the entry point."""

from .stages.train_predictors import main

if __name__ == "__main__":
    raise SystemExit(main())
