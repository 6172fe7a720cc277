"""Held-out English prose for perplexity and profiling runs.

The text is the prose (the ``<p>`` paragraphs of the main body, no code blocks) of the Python
3.11 documentation as Debian ships it in the ``python3.11-doc`` package::

    apt-get install -y --no-install-recommends python3.11-doc

It is read in a fixed order (tutorial, howto, faq, then the rest), so the same ``min_chars``
always gives the same text. Usable as a module (``from corpus import held_out_text``) or as a
script (``python benchmarks/corpus.py --chars 20000`` prints the text).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

#: Where python3.11-doc puts its HTML (override with POWERINFER_RS_CORPUS_DIR).
DOC_DIR = Path(os.environ.get("POWERINFER_RS_CORPUS_DIR", "/usr/share/doc/python3.11/html"))
#: Sections read first, in this order; every other section follows, sorted.
SECTION_ORDER = ("tutorial", "howto", "faq", "using", "reference", "library")
SOURCE_NAME = "python3.11-doc (Debian): prose paragraphs of the Python 3.11 documentation"

INSTALL_HINT = (
    "held-out text not found: this needs the Debian package python3.11-doc "
    f"(HTML under {DOC_DIR}). Install it with\n"
    "    sudo apt-get install -y --no-install-recommends python3.11-doc\n"
    "or point POWERINFER_RS_CORPUS_DIR at another copy of the Python 3.11 HTML docs."
)


class CorpusError(RuntimeError):
    """The held-out text is missing or too short."""


class _ParagraphParser(HTMLParser):
    """Collects the text of <p> elements inside <div role="main">, skipping code and the
    header-link pilcrows."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._div_depth = 0  # depth of <div> nesting inside the main body (0 = outside)
        self._in_p = False
        self._skip = 0  # inside <pre>, <script>, <style>, or a headerlink
        self._buf: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            if self._div_depth:
                self._div_depth += 1
            elif a.get("role") == "main":
                self._div_depth = 1
            return
        if not self._div_depth:
            return
        headerlink = tag == "a" and "headerlink" in (a.get("class") or "")
        if tag in ("pre", "script", "style") or headerlink:
            self._skip += 1
        elif tag == "p":
            self._in_p = True
            self._buf = []

    def handle_endtag(self, tag):
        if tag == "div" and self._div_depth:
            self._div_depth -= 1
            return
        if not self._div_depth:
            return
        if tag in ("pre", "script", "style") or (tag == "a" and self._skip):
            self._skip = max(0, self._skip - 1)
        elif tag == "p" and self._in_p:
            self._in_p = False
            text = re.sub(r"\s+", " ", "".join(self._buf)).strip()
            if len(text) >= 40 and " " in text:  # drop captions, lone labels
                self.paragraphs.append(text)

    def handle_data(self, data):
        if self._in_p and not self._skip:
            self._buf.append(data)


def _html_files(doc_dir: Path) -> list[Path]:
    sections = [
        d.name for d in sorted(doc_dir.iterdir()) if d.is_dir() and not d.name.startswith("_")
    ]
    ordered = [s for s in SECTION_ORDER if s in sections]
    ordered += [s for s in sections if s not in SECTION_ORDER]
    files: list[Path] = []
    for s in ordered:
        # reading order: the order the section's index.html links its pages, then the rest
        rest = sorted(p.resolve() for p in (doc_dir / s).rglob("*.html"))
        index = doc_dir / s / "index.html"
        first: list[Path] = []
        if index.is_file():
            for href in re.findall(r'href="([^"#]+\.html)', index.read_text(errors="replace")):
                p = (index.parent / href).resolve()
                if p in rest and p not in first:
                    first.append(p)
        files.extend(first + [p for p in rest if p not in first])
    return files


def held_out_text(min_chars: int = 20000) -> str:
    """At least ``min_chars`` characters of English prose (whole paragraphs, joined by blank
    lines), always the same for the same ``min_chars``. Raises :class:`CorpusError` telling how
    to install the source package if it is missing."""
    if not (DOC_DIR / "tutorial").is_dir():
        raise CorpusError(INSTALL_HINT)
    out: list[str] = []
    total = 0
    for path in _html_files(DOC_DIR):
        parser = _ParagraphParser()
        parser.feed(path.read_text(encoding="utf-8", errors="replace"))
        for para in parser.paragraphs:
            out.append(html.unescape(para))
            total += len(para) + 2
            if total >= min_chars:
                return "\n\n".join(out)
    raise CorpusError(f"only {total} characters of prose under {DOC_DIR}, {min_chars} asked for")


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
