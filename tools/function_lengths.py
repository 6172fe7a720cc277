"""Functions longer than a limit, in the Python and Rust sources outside tests.

A function's length is its lines from the `def`/`fn` line to its last line, blank lines and
comments included (what a reader scrolls through). Python functions come from `ast` (nested
functions count on their own and inside their parent); Rust functions from matching braces after
an `fn` item, skipping strings, chars and comments. Test code does not count: files under a
`tests` folder or named `tests.rs`/`test_*.py`, and in a Rust file everything after its first
`#[cfg(test)]` line (where our test modules live).

    python3 tools/function_lengths.py            # list what is over 120 lines, exit 1 if any
    python3 tools/function_lengths.py --limit 80 --all   # every function over 80, longest first
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 120
RUST_FN = re.compile(
    r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:default\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_$][A-Za-z0-9_$]*)"
)


@dataclass(frozen=True)
class Function:
    """One function: where it is and how long."""

    path: str
    line: int
    name: str
    lines: int


def _is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return "tests" in parts[:-1] or name == "tests.rs" or name.startswith("test_")


def python_functions(rel: str, text: str) -> list[Function]:
    """Every function and method of one Python file."""
    tree = ast.parse(text, filename=rel)
    return [
        Function(rel, node.lineno, node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _code_only(text: str) -> str:
    """`text` with Rust comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 8]) and not text[i - 1:i].isalnum():
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            j = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if j < 0 else j + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def rust_functions(rel: str, text: str) -> list[Function]:
    """Every `fn` with a body in one Rust file, up to its first `#[cfg(test)]`."""
    code = _code_only(text)
    lines = code.split("\n")
    for k, line in enumerate(lines):
        if line.strip().startswith("#[cfg(test)]"):
            lines = lines[:k]
            break
    found = []
    for k, line in enumerate(lines):
        m = RUST_FN.match(line)
        if not m:
            continue
        depth, opened, end = 0, False, None
        for j in range(k, len(lines)):
            for ch in lines[j] if j > k else line[m.end():]:
                if ch == ";" and not opened and depth == 0:
                    end = -1  # a declaration without a body (trait item, extern)
                    break
                if ch == "{":
                    depth += 1
                    opened = True
                elif ch == "}":
                    depth -= 1
                    if opened and depth == 0:
                        end = j
                        break
            if end is not None:
                break
        if end is not None and end >= 0:
            found.append(Function(rel, k + 1, m.group(1), end - k + 1))
    return found


def tracked_sources(root: Path) -> list[str]:
    """The Python and Rust files git tracks (and untracked ones it does not ignore)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.rs"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout
    return sorted({p for p in out.splitlines() if (root / p).is_file()})


def functions(root: Path = ROOT) -> list[Function]:
    """Every function outside test code, in the tree at `root`."""
    found: list[Function] = []
    for rel in tracked_sources(root):
        if _is_test_path(rel):
            continue
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        found += python_functions(rel, text) if rel.endswith(".py") else rust_functions(rel, text)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=LIMIT, help="the most lines a function may have")
    ap.add_argument("--all", action="store_true", help="list every function over the limit "
                    "and exit 0 (for planning), instead of failing")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to read (default: this one)")
    a = ap.parse_args(argv)
    over = sorted((f for f in functions(a.root) if f.lines > a.limit), key=lambda f: -f.lines)
    for f in over:
        print(f"{f.lines:5d}  {f.path}:{f.line}  {f.name}")
    if over and not a.all:
        print(f"{len(over)} function(s) over {a.limit} lines outside tests", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
