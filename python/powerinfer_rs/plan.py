"""``python -m powerinfer_rs.plan``: neuron placement under a VRAM budget (see ``--help``).

The work is in :mod:`powerinfer_rs.planning`; this module is only the entry point.
"""

from __future__ import annotations

import sys

from .planning.cli import main

if __name__ == "__main__":
    sys.exit(main())
