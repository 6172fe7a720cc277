"""``python -m powerinfer_rs.profile``: how often each FFN neuron fires.

The work is in :mod:`powerinfer_rs.stages.profile`; this module is only the entry point."""

from .stages.profile import main

if __name__ == "__main__":
    raise SystemExit(main())
