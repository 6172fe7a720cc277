#!/usr/bin/env python3
"""Import circles: fails (exit 1) when a file of the Python package or of a Rust crate depends,
through its imports, on itself.

Usage: ``python tools/import_cycles.py [--root DIR] [--package DIR]... [--crate DIR]...
[--allow-crate NAME]...``. Without ``--package``/``--crate`` it checks ``python/powerinfer_rs``
and every ``crates/*/src`` under the root (the repository by default). Stdlib only; a second or so.

A circle is a strongly connected component of more than one file, or a file importing itself.
Each is printed as its files, one shortest circle through them in order, and every edge inside
it with the line that makes it.

The Python rules (``--package DIR``, a package directory):

* every ``.py`` file is a module (``pkg/__init__.py`` is ``pkg``); extension modules (``.so``,
  ``.pyd``, or their ``.pyi`` stub where the extension is not built) are modules without
  imports;
* an edge from A to B for every import of B in A: at module level *and* inside functions and
  methods (a lazy import is still a dependency), ``importlib.import_module`` with a constant
  name included; imports under ``if TYPE_CHECKING:`` do not count;
* ``import a.b.c`` is an edge to ``a.b.c`` (the deepest prefix that is a module of the
  package); ``from P import name`` is an edge to ``P.name`` when that is a module, to the module
  a ``lazy_exports`` table of ``P/__init__.py`` reads ``name`` from when it lists it, and to
  ``P`` otherwise; relative imports are resolved; the implicit imports of parent packages are
  not edges; imports from outside the package are not edges.

The Rust rules (``--crate DIR``, a crate's ``src``; each crate is checked on its own):

* files are modules: ``lib.rs`` (or ``main.rs``) the root, ``a/b.rs`` and ``a/b/mod.rs`` the
  module ``a::b``; an inline ``mod x { ... }`` belongs to its file (``use super::*`` in a
  ``#[cfg(test)] mod tests`` is no edge);
* what a file's ``#[cfg(test)]`` modules import is the edge of a node of their own
  (``a.rs [cfg(test)]``), as the tests outside the package are for Python: a unit test that
  uses ``crate::testing`` helpers, which use the module under test, is no circle
  (``--test-modules-in-file`` counts those imports as the file's own);
* comments, doc comments, strings and char literals are skipped;
* an edge for every ``use`` of ``crate::``, ``super::``, ``self::`` or of a child module
  (``use x::Y`` where ``x`` is a module under the current one), ``pub use`` re-exports
  included (they are imports), ``{...}`` groups expanded; and for every path in code that
  starts with ``crate::`` or ``super::`` (``$crate::`` in macros excluded);
* a path goes to the deepest module file it names (``crate::a::b::Item`` -> ``a/b.rs`` if it
  exists, else ``a.rs``; ``super::`` from ``a/b.rs`` is ``a.rs`` or ``a/mod.rs``); a path back
  into its own file is no edge;
* ``mod x;`` declarations are not edges.

``--allow-crate NAME`` (the directory's name under crates/) skips that crate: its circles are
printed but do not fail the run.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

#: What marks a Rust file's ``#[cfg(test)]`` modules (as a node, and in an edge's reason).
TEST_NODE = " [cfg(test)]"


@dataclass
class Graph:
    """Files (their paths, relative to the root shown) and edges with why each exists."""

    name: str
    nodes: list[str] = field(default_factory=list)
    edges: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, a: str, b: str, why: str) -> None:
        out = self.edges.setdefault(a, {})
        if b not in out or (TEST_NODE in out[b] and TEST_NODE not in why):
            out[b] = why  # a reason outside test code, when there is one


# ---------------------------------------------------------------------------------------------
# Cycles


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The components that are circles: more than one file, or one file with an edge to itself
    (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph.nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.edges.get(start, {}))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.edges.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1 or node in graph.edges.get(node, {}):
                    out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def shortest_circle(graph: Graph, comp: list[str]) -> list[str]:
    """One shortest circle through the component's first file, inside the component."""
    inside = set(comp)
    start = comp[0]
    if start in graph.edges.get(start, {}):
        return [start, start]
    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.edges.get(node, {})):
            if nxt not in inside:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [*reversed(path), start]
            if nxt not in prev:
                prev[nxt] = node
                queue.append(nxt)
    return comp


def report(graph: Graph, comps: list[list[str]], out=sys.stdout) -> None:
    for comp in comps:
        print(f"{graph.name}: import circle of {len(comp)} file(s):", file=out)
        print("  " + " -> ".join(shortest_circle(graph, comp)), file=out)
        inside = set(comp)
        for a in comp:
            for b, why in sorted(graph.edges.get(a, {}).items()):
                if b in inside:
                    print(f"    {a} -> {b}  ({why})", file=out)


# ---------------------------------------------------------------------------------------------
# Python


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk_skipping_type_checking(tree: ast.AST):
    """Every node of ``tree`` except those only under ``if TYPE_CHECKING:`` (its ``else:`` is
    kept)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """``{name: submodule}`` from a ``lazy_exports(__name__, {...})`` table in a package's
    ``__init__`` (the dict given directly or through a module-level name)."""
    dicts: dict[str, ast.Dict] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    dicts[t.id] = node.value
    table: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and len(node.args) >= 2):
            continue
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if fname != "lazy_exports":
            continue
        arg = node.args[1]
        if isinstance(arg, ast.Name):
            arg = dicts.get(arg.id)
        if not isinstance(arg, ast.Dict):
            continue
        for key, value in zip(arg.keys, arg.values):
            if isinstance(key, ast.Constant) and isinstance(value, (ast.List, ast.Tuple)):
                for elt in value.elts:
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        table[elt.value] = key.value
    return table


def python_graph(package: Path, root: Path) -> Graph:
    """The import graph of the package at ``package`` (a directory with ``__init__.py``)."""
    package = package.resolve()
    top = package.name
    modules: dict[str, Path] = {}  # dotted name -> file
    packages: set[str] = set()
    for path in sorted(package.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(package.parent)
        parts = list(rel.parts)
        if path.suffix == ".py":
            parts[-1] = path.stem
            if parts[-1] == "__init__":
                parts.pop()
                packages.add(".".join(parts))
        elif path.suffix in (".so", ".pyd", ".pyi"):
            # an extension module, or its stub (a fresh checkout has not built it yet)
            parts[-1] = path.name.split(".")[0]
            if path.suffix == ".pyi" and path.with_suffix(".py").exists():
                continue
        else:
            continue
        modules.setdefault(".".join(parts), path)

    def show(name: str) -> str:
        p = modules[name]
        try:
            return str(p.relative_to(root))
        except ValueError:
            return str(p)

    graph = Graph(f"python {top}")
    graph.nodes = sorted(show(m) for m in modules)
    trees: dict[str, ast.Module] = {}
    for name, path in modules.items():
        if path.suffix == ".py":
            trees[name] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lazy = {name: _lazy_table(trees[name]) for name in packages if name in trees}

    def deepest(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in modules:
                return cand
            parts.pop()
        return None

    for name, tree in trees.items():
        is_pkg = name in packages
        here = name if is_pkg else name.rpartition(".")[0]  # the package relative imports start at

        def relative(level: int, module: str | None, here: str = here) -> str:
            base = here.split(".")
            if level > 1:
                base = base[: len(base) - (level - 1)]
            return ".".join(base + ([module] if module else []))

        def edge(
            target: str | None, line: int, text: str, explicit: bool = True, name: str = name
        ) -> None:
            if target is None or not (target == top or target.startswith(top + ".")):
                return
            if target == name and not explicit:
                return
            graph.add(show(name), show(target), f"line {line}: {text}")

        for node in _walk_skipping_type_checking(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    edge(deepest(alias.name), node.lineno, f"import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                base = relative(node.level, node.module) if node.level else node.module or ""
                src = "." * node.level + (node.module or "")
                for alias in node.names:
                    text = f"from {src} import {alias.name}"
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        edge(sub, node.lineno, text)
                    elif alias.name in lazy.get(base, {}):
                        edge(f"{base}.{lazy[base][alias.name]}", node.lineno, text)
                    else:
                        edge(deepest(base), node.lineno, text, explicit=base != name)
            elif isinstance(node, ast.Call):
                func = node.func
                is_import_module = (
                    isinstance(func, ast.Attribute)
                    and func.attr == "import_module"
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "importlib"
                ) or (isinstance(func, ast.Name) and func.id == "import_module")
                if not is_import_module or not node.args:
                    continue
                arg = node.args[0]
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    continue
                target = arg.value
                if target.startswith("."):
                    level = len(target) - len(target.lstrip("."))
                    target = relative(level, target[level:] or None)
                edge(deepest(target), node.lineno, f"importlib.import_module({arg.value!r})")
    return graph


# ---------------------------------------------------------------------------------------------
# Rust

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_open>/\*)
  | (?P<raw_string>b?r(?P<hashes>\#*)")
  | (?P<string>b?")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])')
  | (?P<lifetime>'[A-Za-z_]\w*)
  | (?P<path>\$?(?:[A-Za-z_]\w*)(?:\s*::\s*(?:[A-Za-z_]\w*|\*|\{))*)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def _rust_tokens(text: str):
    """``(kind, value, line)`` for the code of ``text``: comments, strings and chars dropped;
    identifiers with their ``::`` paths as one ``path`` token; other characters one by one."""
    pos, line, n = 0, 1, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        kind = m.lastgroup
        if kind == "hashes":
            kind = "raw_string"
        start = pos
        if kind == "block_open":
            depth, pos = 1, m.end()
            while depth and pos < n:
                if text.startswith("/*", pos):
                    depth, pos = depth + 1, pos + 2
                elif text.startswith("*/", pos):
                    depth, pos = depth - 1, pos + 2
                else:
                    pos += 1
        elif kind == "raw_string":
            end = text.find('"' + m.group("hashes"), m.end())
            pos = n if end < 0 else end + 1 + len(m.group("hashes"))
        elif kind == "string":
            pos = m.end()
            while pos < n and text[pos] != '"':
                pos += 2 if text[pos] == "\\" else 1
            pos += 1
        else:
            pos = m.end()
            if kind in ("path", "punct"):
                value = m.group()
                if kind == "path" and value.endswith("{"):
                    # `a::b::{` : the path, then the brace on its own
                    value = value[:-1].rstrip().removesuffix("::").rstrip()
                    yield "path", re.sub(r"\s+", "", value) + "::", line
                    yield "punct", "{", line + text.count("\n", start, pos)
                else:
                    yield kind, re.sub(r"\s+", "", value), line
        line += text.count("\n", start, pos)


def _use_paths(tokens: list[tuple[str, str, int]], i: int) -> tuple[list[str], int]:
    """The full paths of the ``use`` tree starting at ``tokens[i]`` (after ``use``), and the
    index after its ``;``."""
    paths: list[str] = []

    def tree(i: int, prefix: str) -> int:
        # one tree: path [as x] | path::{ tree, ... } | path::* | { ... }
        kind, value, _ = tokens[i]
        if kind == "path":
            i += 1
            if value.endswith("::"):  # a group follows
                return group(i, prefix + value)
            full = prefix + value
            if full.endswith("::self"):
                full = full[: -len("::self")]
            if full:
                paths.append(full)
            if i < len(tokens) and tokens[i][1] == "as":
                i += 2
            return i
        if value == "{":
            return group(i, prefix)
        return i + 1

    def group(i: int, prefix: str) -> int:
        assert tokens[i][1] == "{"
        i += 1
        while i < len(tokens) and tokens[i][1] != "}":
            if tokens[i][1] == ",":
                i += 1
                continue
            i = tree(i, prefix)
        return i + 1

    i = tree(i, "")
    while i < len(tokens) and tokens[i][1] != ";":
        i += 1
    return paths, i + 1


def _scan_rust(tokens: list[tuple[str, str, int]], mod: tuple[str, ...]):
    """What one file's code names: ``(scope, kind, segments, line, text, in_test)`` for every
    ``use`` path (kind ``"use"`` or ``"pub use"``) and every ``crate::``/``super::`` path in code
    (kind ``"path"``); ``scope`` is the file's module plus the inline modules around it; and the
    names of the ``#[macro_export]`` macros the file defines."""
    found = []
    macros: list[str] = []
    inline: list[tuple[int, str, bool]] = []  # (depth its block closes at, name, cfg(test))
    depth = 0
    i = 0
    values = [v for _, v, _ in tokens]

    def attributes_before(j: int) -> list[list[str]]:
        """The attributes (``#[...]``, their tokens inside the brackets) on the item whose
        keyword is token ``j`` (visibility skipped)."""
        while j > 0 and values[j - 1] in ("pub", "(", ")", "crate", "super", "self", "in"):
            j -= 1
        attrs = []
        while j > 1 and values[j - 1] == "]":
            depth, k = 0, j - 1
            while k >= 0:
                depth += {"]": 1, "[": -1}.get(values[k], 0)
                if depth == 0:
                    break
                k -= 1
            if k < 1 or values[k - 1] != "#":
                break
            attrs.append(values[k + 1 : j - 1])
            j = k - 1
        return attrs

    def is_test(j: int) -> bool:
        return any(
            a[:1] == ["cfg"] and "test" in a and "not" not in a for a in attributes_before(j)
        )

    while i < len(tokens):
        kind, value, line = tokens[i]
        scope = mod + tuple(n for _, n, _ in inline)
        in_test = any(t for _, _, t in inline)
        if kind == "punct":
            if value == "{":
                depth += 1
            elif value == "}":
                depth -= 1
                while inline and inline[-1][0] > depth:
                    inline.pop()
            i += 1
            continue
        if value == "mod" and i + 2 < len(tokens) and values[i + 2] == "{":
            test = is_test(i)
            inline.append((depth + 1, values[i + 1], test))
            i += 2
            continue
        if value == "macro_rules" and i + 2 < len(tokens) and values[i + 1] == "!":
            if any(a[:1] == ["macro_export"] for a in attributes_before(i)):
                macros.append(values[i + 2])
            i += 3
            continue
        if value == "use":
            is_pub = i > 0 and (
                values[i - 1] == "pub"
                or (values[i - 1] == ")" and "pub" in values[max(0, i - 6) : i - 1])
            )
            paths, j = _use_paths(tokens, i + 1)
            for p in paths:
                segs = [s for s in p.split("::") if s != "*"]
                found.append(
                    (scope, "pub use" if is_pub else "use", segs, line, f"use {p}", in_test)
                )
            i = j
            continue
        if value == "in" and i > 0 and values[i - 1] == "(":
            i += 2  # pub(in crate::a): a visibility, not an import
            continue
        segs = value.split("::")
        if len(segs) > 1 and segs[0] in ("crate", "super") and not value.startswith("$"):
            segs = [s for s in segs if s not in ("*", "")]
            found.append((scope, "path", segs, line, value, in_test))
        i += 1
    return found, macros


def rust_graph(
    src: Path,
    root: Path,
    name: str | None = None,
    follow_reexports: bool = True,
    tests_apart: bool = True,
) -> Graph:
    """The module graph of one crate's ``src`` directory. With ``follow_reexports``, a path to
    a name that a module re-exports (``pub use a::Name``, ``crate::Name`` from lib.rs) goes on
    to the module the re-export names (the re-exporting file keeps its own edge); without it,
    the path stops at the re-exporting file. With ``tests_apart``, what a file's ``#[cfg(test)]``
    modules import is the edge of a node of its own (``a.rs [cfg(test)]``), as tests outside
    the package are for Python; without it, the file's own."""
    src = src.resolve()
    modules: dict[tuple[str, ...], Path] = {}
    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src).parts
        if rel[0] == "bin":
            continue
        if len(rel) == 1 and rel[0] in ("lib.rs", "main.rs"):
            if () in modules and rel[0] == "main.rs":
                continue
            modules[()] = path
            continue
        parts = list(rel)
        if parts[-1] == "mod.rs":
            parts.pop()
        else:
            parts[-1] = parts[-1][:-3]
        modules.setdefault(tuple(parts), path)
    crate = name or src.parent.name

    def show(mod: tuple[str, ...]) -> str:
        p = modules[mod]
        try:
            return str(p.relative_to(root))
        except ValueError:
            return str(p)

    scans = {}
    macros: dict[str, tuple[str, ...]] = {}
    # (module, name) -> (scope, segments) of a `pub use`; (module, "*") -> globs
    reexports: dict[tuple[tuple[str, ...], str], list[tuple[tuple[str, ...], list[str]]]] = {}
    for mod, path in modules.items():
        found, defined = _scan_rust(list(_rust_tokens(path.read_text(encoding="utf-8"))), mod)
        scans[mod] = found
        for m in defined:
            macros.setdefault(m, mod)
        for scope, kind, segs, _, text, _ in found:
            if kind == "pub use" and scope == mod:
                key = "*" if text.endswith("*") else segs[-1]
                reexports.setdefault((mod, key), []).append((scope, segs))

    def resolve(segments: list[str], scope: tuple[str, ...], hops: int = 0):
        """The deepest module file ``segments`` names, seen from ``scope`` (the file's module
        plus any inline modules); None for a path out of the crate."""
        if not segments:
            return None
        first = segments[0]
        if first == "crate":
            at: tuple[str, ...] = ()
        elif first in ("super", "self"):
            at = scope
        elif scope + (first,) in modules:  # `use x::...` of a child module (2018 paths)
            at = scope
            segments = ["self", *segments]
        else:
            return None
        rest = segments[1:]
        if first == "super":
            at = at[:-1]
        while rest and rest[0] == "super":
            at, rest = at[:-1], rest[1:]
        while rest and rest[0] == "self":
            rest = rest[1:]
        for seg in rest:
            if at + (seg,) not in modules:
                break
            at, rest = at + (seg,), rest[1:]
        while at not in modules:  # inline modules belong to their file
            at, rest = at[:-1], []
        if not rest or not follow_reexports or hops > 8:
            return at
        if at == () and rest[0] in macros:
            return macros[rest[0]]
        for rscope, rsegs in reexports.get((at, rest[0]), []):
            target = resolve(rsegs + rest[1:], rscope, hops + 1)
            if target is not None:
                return target
        for rscope, rsegs in reexports.get((at, "*"), []):
            target = resolve(rsegs + rest, rscope, hops + 1)
            if target is not None and target != at:
                return target
        return at

    graph = Graph(f"rust crate {crate}")
    graph.nodes = sorted(show(m) for m in modules)
    for mod, found in scans.items():
        for scope, kind, segs, line, text, in_test in found:
            target = resolve(segs, scope)
            if target is None or modules[target] == modules[mod]:
                continue
            why = f"line {line}: {'pub ' if kind == 'pub use' else ''}{text}"
            source = show(mod) + (TEST_NODE if in_test and tests_apart else "")
            graph.add(source, show(target), why + (TEST_NODE if in_test else ""))
    return graph


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--package", type=Path, action="append", default=[])
    ap.add_argument("--crate", type=Path, action="append", default=[], help="a crate's src/")
    ap.add_argument("--allow-crate", action="append", default=[], metavar="NAME")
    ap.add_argument(
        "--test-modules-in-file",
        action="store_true",
        help="count what a Rust file's #[cfg(test)] modules import as the file's own imports",
    )
    args = ap.parse_args(argv)
    root = args.root.resolve()
    packages, crates = args.package, args.crate
    if not packages and not crates:
        packages = [root / "python" / "powerinfer_rs"]
        crates = sorted(p for p in (root / "crates").glob("*/src") if p.is_dir())
    failed = 0
    checked = []
    for pkg in packages:
        g = python_graph(pkg, root)
        comps = strongly_connected(g)
        report(g, comps)
        failed += len(comps)
        checked.append(f"{g.name}: {len(g.nodes)} files, {len(comps)} circle(s)")
    for src in crates:
        src = src.resolve()
        crate = src.parent.name
        g = rust_graph(src, root, crate, tests_apart=not args.test_modules_in_file)
        comps = strongly_connected(g)
        report(g, comps)
        allowed = crate in args.allow_crate
        if not allowed:
            failed += len(comps)
        note = " (allowed)" if allowed and comps else ""
        checked.append(f"{g.name}: {len(g.nodes)} files, {len(comps)} circle(s){note}")
    for line in checked:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
