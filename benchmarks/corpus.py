"""Held-out English prose for perplexity and profiling runs.

The text is the prose (the ``<p>`` paragraphs of the main body, no code blocks) of the Python
3.11 documentation as Debian ships it in the ``python3.11-doc`` package::

    apt-get install -y --no-install-recommends python3.11-doc

It is read in a fixed order (tutorial, howto, faq, then the rest), so the same ``min_chars``
always gives the same text. The one implementation lives in ``powerinfer_rs.stages.corpus``
(the calibrate/profile/evaluate tools read their corpora with it); this module re-exports it.
Usable as a module (``from corpus import held_out_text``) or as a script
(``python benchmarks/corpus.py --chars 20000`` prints the text).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import import_powerinfer  # noqa: E402

_pi, _why = import_powerinfer()  # installed, else the checkout's python/
if _pi is None:
    raise ImportError(f"benchmarks/corpus.py needs powerinfer_rs: {_why}")
from powerinfer_rs.stages.corpus import (  # noqa: E402
    DOC_DIR,
    INSTALL_HINT,
    SECTION_ORDER,
    SOURCE_NAME,
    CorpusError,
    held_out_text,
    html_files,
)

__all__ = [
    "DOC_DIR",
    "INSTALL_HINT",
    "SECTION_ORDER",
    "SOURCE_NAME",
    "CorpusError",
    "held_out_ids",
    "held_out_text",
    "html_files",
]


def held_out_ids(tokenizer, need: int) -> list[int]:
    """At least ``need`` token ids of the held-out text (no BOS), read in growing prefixes."""
    ids: list[int] = []
    chars = 6 * need
    while len(ids) < need:
        ids = tokenizer.encode(held_out_text(chars), add_bos=False)
        chars *= 2
    return ids


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print the held-out text used for perplexity runs.")
    ap.add_argument("--chars", type=int, default=20000, help="minimum characters (default 20000)")
    args = ap.parse_args(argv)
    try:
        text = held_out_text(args.chars)
    except CorpusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    print(f"\n[{len(text)} characters from {SOURCE_NAME}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
