"""``python -m powerinfer_rs.evaluate``: perplexity of the sparsity modes and predictor quality.

The work is in :mod:`powerinfer_rs.stages.evaluate`; this module is only the entry point."""

from .stages.evaluate import main

if __name__ == "__main__":
    raise SystemExit(main())
