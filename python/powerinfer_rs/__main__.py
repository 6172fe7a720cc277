"""``python -m powerinfer_rs``: see :mod:`powerinfer_rs.cli`."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
