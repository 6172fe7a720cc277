"""Text for calibration, profiling and perplexity: plain text files, HTML pages (Debian doc
packages) and the held-out prose of the Python 3.11 documentation.

The held-out text is the prose (the ``<p>`` paragraphs of the main body, no code blocks) of the
Python 3.11 documentation as Debian ships it in the ``python3.11-doc`` package::

    apt-get install -y --no-install-recommends python3.11-doc

It is read in a fixed order (tutorial, howto, faq, then the rest), so the same ``min_chars``
always gives the same text. ``benchmarks/corpus.py`` re-exports this module.

:func:`read_corpus` reads what the tools' ``--corpus`` / ``--text`` flags name: a plain text
file, an HTML file (its main-body paragraphs, or all its text with the tags stripped when it
has no Sphinx main body), or a directory (its ``.html``/``.htm``/``.txt``/``.md``/``.rst``
files, a Sphinx HTML tree in reading order).
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

from ..errors import ModelFileError

#: Where python3.11-doc puts its HTML (override with POWERINFER_RS_CORPUS_DIR).
DOC_DIR = Path(os.environ.get("POWERINFER_RS_CORPUS_DIR", "/usr/share/doc/python3.11/html"))
#: Sections read first, in this order; every other section follows, sorted.
SECTION_ORDER = ("tutorial", "howto", "faq", "using", "reference", "library")
SOURCE_NAME = "python3.11-doc (Debian): prose paragraphs of the Python 3.11 documentation"
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst")

INSTALL_HINT = (
    "held-out text not found: this needs the Debian package python3.11-doc "
    f"(HTML under {DOC_DIR}). Install it with\n"
    "    sudo apt-get install -y --no-install-recommends python3.11-doc\n"
    "or point POWERINFER_RS_CORPUS_DIR at another copy of the Python 3.11 HTML docs."
)


class CorpusError(ModelFileError):
    """A corpus file is missing, unreadable, or the text is too short."""


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


class _TextParser(HTMLParser):
    """All text of a page outside <script>/<style>/<head>, one block per line."""

    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dd", "dt"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self._skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self._skip = max(0, self._skip - 1)
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _raw_paragraphs(source: str) -> list[str]:
    parser = _ParagraphParser()
    parser.feed(source)
    return parser.paragraphs


def html_paragraphs(source: str) -> list[str]:
    """The main-body prose paragraphs of a Sphinx HTML page (empty when it has none)."""
    return [html.unescape(p) for p in _raw_paragraphs(source)]


def html_to_text(source: str) -> str:
    """Readable text of any HTML page: its Sphinx main-body paragraphs when it has them,
    else all of its text with the tags stripped."""
    paras = html_paragraphs(source)
    if paras:
        return "\n\n".join(paras)
    parser = _TextParser()
    parser.feed(source)
    lines = (re.sub(r"[ \t\r\f\v]+", " ", ln).strip() for ln in "".join(parser.parts).split("\n"))
    out, blank = [], False
    for ln in lines:
        if ln:
            out.append(ln)
            blank = False
        elif not blank and out:
            out.append("")
            blank = True
    return "\n".join(out).strip()


def html_files(doc_dir: Path) -> list[Path]:
    """HTML pages of a doc tree in reading order: sections in :data:`SECTION_ORDER` first, each
    in the order its ``index.html`` links its pages, then the rest sorted. Loose pages at the
    top come last."""
    sections = [
        d.name for d in sorted(doc_dir.iterdir()) if d.is_dir() and not d.name.startswith("_")
    ]
    ordered = [s for s in SECTION_ORDER if s in sections]
    ordered += [s for s in sections if s not in SECTION_ORDER]
    files: list[Path] = []
    for s in ordered:
        rest = sorted(
            p.resolve() for p in (doc_dir / s).rglob("*") if p.suffix.lower() in HTML_SUFFIXES
        )
        index = doc_dir / s / "index.html"
        first: list[Path] = []
        if index.is_file():
            for href in re.findall(r'href="([^"#]+\.html)', index.read_text(errors="replace")):
                p = (index.parent / href).resolve()
                if p in rest and p not in first:
                    first.append(p)
        files.extend(first + [p for p in rest if p not in first])
    files.extend(sorted(p.resolve() for p in doc_dir.glob("*.html")))
    return files


def _is_html(path: Path, head: str) -> bool:
    if path.suffix.lower() in HTML_SUFFIXES:
        return True
    h = head.lstrip()[:200].lower()
    return h.startswith("<!doctype html") or h.startswith("<html")


def read_text_file(path: str | os.PathLike[str]) -> str:
    """The text of one corpus file: plain text as is (UTF-8, bad bytes replaced), HTML through
    :func:`html_to_text`."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise CorpusError(f"{p}: cannot read corpus file: {e.strerror or e}") from None
    if "\x00" in raw[:4096]:
        raise CorpusError(f"{p}: looks like a binary file, not text")
    return html_to_text(raw) if _is_html(p, raw[:1024]) else raw


def _dir_files(d: Path) -> list[Path]:
    if (d / "index.html").is_file() or any(
        x.is_dir() and (x / "index.html").is_file() for x in d.iterdir()
    ):
        found = html_files(d)
        if found:
            return found
    return sorted(
        p for p in d.rglob("*") if p.is_file() and p.suffix.lower() in HTML_SUFFIXES + TEXT_SUFFIXES
    )


def read_corpus(
    paths: Iterable[str | os.PathLike[str]], max_chars: int | None = None
) -> tuple[str, list[str]]:
    """Text of the corpus ``paths`` (files or directories), joined by blank lines, and the
    names read. Stops once ``max_chars`` characters are collected (the last piece is cut)."""
    pieces: list[str] = []
    names: list[str] = []
    total = 0
    for path in paths:
        p = Path(path)
        if p.is_dir():
            files = _dir_files(p)
            if not files:
                raise CorpusError(f"{p}: no .txt/.html files in this directory")
        elif p.is_file():
            files = [p]
        else:
            raise CorpusError(f"{p}: no such corpus file or directory")
        names.append(str(p))
        for f in files:
            text = read_text_file(f).strip()
            if not text:
                continue
            pieces.append(text)
            total += len(text) + 2
            if max_chars is not None and total >= max_chars:
                return "\n\n".join(pieces)[:max_chars], names
    text = "\n\n".join(pieces)
    if not text.strip():
        raise CorpusError(f"no text in the corpus {[str(p) for p in paths]}")
    return text, names


def held_out_text(min_chars: int = 20000) -> str:
    """At least ``min_chars`` characters of English prose (whole paragraphs, joined by blank
    lines), always the same for the same ``min_chars``. Raises :class:`CorpusError` telling how
    to install the source package if it is missing."""
    if not (DOC_DIR / "tutorial").is_dir():
        raise CorpusError(INSTALL_HINT)
    out: list[str] = []
    total = 0
    for path in html_files(DOC_DIR):
        for para in _raw_paragraphs(path.read_text(encoding="utf-8", errors="replace")):
            out.append(html.unescape(para))
            total += len(para) + 2
            if total >= min_chars:
                return "\n\n".join(out)
    raise CorpusError(f"only {total} characters of prose under {DOC_DIR}, {min_chars} asked for")


__all__ = [
    "DOC_DIR",
    "INSTALL_HINT",
    "SOURCE_NAME",
    "CorpusError",
    "held_out_text",
    "html_files",
    "html_paragraphs",
    "html_to_text",
    "read_corpus",
    "read_text_file",
]
