"""tools/import_cycles.py: no import circle in the Python package, and the checker finds the
circles it must (a Python package and a Rust crate written here) and passes acyclic ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "import_cycles.py"
PACKAGE = ROOT / "python" / "powerinfer_rs"

pytestmark = pytest.mark.skipif(
    not TOOL.is_file() or not PACKAGE.is_dir(), reason="needs the source tree"
)


def _tool():
    return load_tool("import_cycles")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _python_circles(tmp_path: Path, files: dict[str, str]) -> list[list[str]]:
    _write(tmp_path, files)
    tool = _tool()
    return tool.strongly_connected(tool.python_graph(tmp_path / "pkg", tmp_path))


def _rust_circles(tmp_path: Path, files: dict[str, str]) -> list[list[str]]:
    _write(tmp_path / "src", files)
    tool = _tool()
    return tool.strongly_connected(tool.rust_graph(tmp_path / "src", tmp_path, "fixture"))


def test_the_python_package_has_no_import_circle():
    tool = _tool()
    graph = tool.python_graph(PACKAGE, ROOT)
    assert len(graph.nodes) > 50
    circles = tool.strongly_connected(graph)
    assert circles == [], "\n".join(" ".join(c) for c in circles)


PYTHON_BASE = {
    "pkg/__init__.py": "",
    "pkg/low.py": "X = 1\n",
    "pkg/sub/__init__.py": """\
        from .._lazy import lazy_exports

        _EXPORTS = {"impl": ["Thing"]}
        __all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
        """,
    "pkg/_lazy.py": "def lazy_exports(name, exports):\n    return [], None\n",
    "pkg/sub/impl.py": "from ..low import X\nThing = X\n",
}


def test_python_circles_through_lazy_imports_are_found(tmp_path):
    circles = _python_circles(
        tmp_path,
        {
            **PYTHON_BASE,
            "pkg/a.py": "from . import b\n",
            # inside a function, and through a package's lazy_exports table: still edges
            "pkg/b.py": "def f():\n    from .sub import Thing\n    return Thing\n",
            "pkg/sub/impl.py": "import pkg.a\nThing = 1\n",
        },
    )
    assert circles == [["pkg/a.py", "pkg/b.py", "pkg/sub/impl.py"]]


def test_a_python_module_importing_itself_is_a_circle(tmp_path):
    circles = _python_circles(tmp_path, {**PYTHON_BASE, "pkg/me.py": "from pkg import me\n"})
    assert circles == [["pkg/me.py"]]


def test_an_acyclic_python_package_passes(tmp_path):
    circles = _python_circles(
        tmp_path,
        {
            **PYTHON_BASE,
            "pkg/a.py": "from . import b\nfrom .sub import Thing\nimport os\n",
            # under TYPE_CHECKING: no edge; `from . import X` of a name: the package's __init__
            "pkg/b.py": """\
                from typing import TYPE_CHECKING

                from . import low

                if TYPE_CHECKING:
                    from .a import something
                """,
        },
    )
    assert circles == []


def test_an_unbuilt_extension_is_its_stub(tmp_path):
    # a fresh checkout: `_core` is only `_core.pyi`; `from . import _core` is no import of the
    # package's __init__ (which imports the module that imports _core)
    files = {
        "pkg/__init__.py": "from .engine import Engine\n",
        "pkg/_core.pyi": "class Model: ...\n",
        "pkg/engine.py": "from . import _core\nEngine = _core.Model\n",
    }
    assert _python_circles(tmp_path, files) == []
    (tmp_path / "pkg" / "_core.pyi").unlink()
    assert _python_circles(tmp_path, {}) == [["pkg/__init__.py", "pkg/engine.py"]]


RUST_BASE = {
    "lib.rs": """\
        //! crate::a::A in a doc comment is no edge
        pub mod a;
        pub mod b;
        pub mod c;
        pub use a::A;
        """,
    "c/mod.rs": "pub mod d;\npub struct C;\n",
}


def test_rust_circles_are_found(tmp_path):
    circles = _rust_circles(
        tmp_path,
        {
            **RUST_BASE,
            "a.rs": "use crate::{b::B, c};\npub struct A;\n",
            # an inline path, from a file of a folder module up to its parent and back
            "b.rs": "pub struct B;\npub fn f() -> crate::c::d::D { crate::c::d::D }\n",
            "c/d.rs": "pub struct D;\nfn g() { let _ = super::super::A; }\n",
        },
    )
    # crate::A is lib.rs's re-export of a::A: the edge goes on to a.rs
    assert circles == [["src/a.rs", "src/b.rs", "src/c/d.rs"]]
    tool = _tool()
    graph = tool.rust_graph(tmp_path / "src", tmp_path, "fixture")
    assert set(graph.edges["src/c/d.rs"]) == {"src/a.rs"}


def test_rust_super_from_a_folder_module_and_use_groups(tmp_path):
    circles = _rust_circles(
        tmp_path,
        {
            **RUST_BASE,
            "a.rs": "pub struct A;\n",
            "b.rs": "pub struct B;\n",
            "c/mod.rs": "pub mod d;\nuse self::d::{D, E as F};\npub struct C;\n",
            "c/d.rs": "use super::C;\npub struct D;\npub struct E;\n",
        },
    )
    assert circles == [["src/c/d.rs", "src/c/mod.rs"]]


def test_an_acyclic_rust_crate_passes(tmp_path):
    # b uses a; every mention of b in a is no import (were one counted, a circle)
    circles = _rust_circles(
        tmp_path,
        {
            **RUST_BASE,
            "a.rs": """\
                use crate::c::C;
                // use crate::b::B; (a comment)
                /* crate::b::B /* nested */ crate::b::B */
                /// crate::b::B in a doc comment
                pub struct A;
                pub fn name() -> &'static str { "crate::b::B" }
                pub fn raw() -> &'static str { r#"crate::b::B "quoted""# }
                pub fn ch() -> char { '"' }
                pub fn life<'a>(x: &'a C) -> &'a C { x }
                macro_rules! m { () => { $crate::b::B }; }
                #[cfg(test)]
                mod tests {
                    use super::*;
                    fn t() { let _ = super::A; }
                }
                """,
            "b.rs": "use crate::a::A;\npub struct B;\n",
            "c/mod.rs": "pub mod d;\npub struct C;\n",
            "c/d.rs": "use crate::b::B;\npub struct D;\n",
        },
    )
    assert circles == []
    tool = _tool()
    graph = tool.rust_graph(tmp_path / "src", tmp_path, "fixture")
    assert set(graph.edges["src/a.rs"]) == {"src/c/mod.rs"}


def test_rust_unit_tests_are_apart_from_their_file(tmp_path):
    # a's unit tests use the crate's test helpers, which use a: no circle of the library's
    files = {
        "lib.rs": "pub mod a;\npub mod testing;\n",
        "a.rs": """\
            pub struct A;
            #[cfg(test)]
            mod tests {
                use super::*;
                use crate::testing::make;
            }
            """,
        "testing.rs": "use crate::a::A;\npub fn make() -> A { A }\n",
    }
    assert _rust_circles(tmp_path, files) == []
    tool = _tool()
    graph = tool.rust_graph(tmp_path / "src", tmp_path, "fixture")
    assert set(graph.edges["src/a.rs [cfg(test)]"]) == {"src/testing.rs"}
    inside = tool.rust_graph(tmp_path / "src", tmp_path, "fixture", tests_apart=False)
    assert tool.strongly_connected(inside) == [["src/a.rs", "src/testing.rs"]]


def test_the_command_fails_on_a_circle_and_passes_without(tmp_path):
    _write(tmp_path / "bad", {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n"})
    _write(tmp_path / "bad", {"pkg/b.py": "from . import a\n"})
    _write(tmp_path / "good", {"pkg/__init__.py": "", "pkg/a.py": "from . import b\n"})
    _write(tmp_path / "good", {"pkg/b.py": "X = 1\n"})
    _write(tmp_path / "crates/knot/src", {"lib.rs": "mod x;\nmod y;\n"})
    _write(tmp_path / "crates/knot/src", {"x.rs": "use crate::y::Y;\npub struct X;\n"})
    _write(tmp_path / "crates/knot/src", {"y.rs": "use super::x::X;\npub struct Y;\n"})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(TOOL), "--root", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    bad = run("--package", str(tmp_path / "bad" / "pkg"))
    assert bad.returncode == 1
    assert "bad/pkg/a.py -> bad/pkg/b.py -> bad/pkg/a.py" in bad.stdout
    assert run("--package", str(tmp_path / "good" / "pkg")).returncode == 0
    crate = str(tmp_path / "crates" / "knot" / "src")
    knot = run("--crate", crate)
    assert knot.returncode == 1 and "rust crate knot: import circle of 2 file(s)" in knot.stdout
    allowed = run("--crate", crate, "--allow-crate", "knot")
    assert allowed.returncode == 0 and "(allowed)" in allowed.stdout
