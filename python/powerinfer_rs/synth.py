"""``python -m powerinfer_rs.synth``: write a synthetic model.

The work is in :mod:`powerinfer_rs.testing.synth`; this module is only the entry point."""

from .testing.synth import main

if __name__ == "__main__":
    raise SystemExit(main())
