"""tools/function_lengths.py: it measures Python functions by ast and Rust functions by their
braces (not fooled by braces in strings, chars and comments), skips test code, and fails only
over the limit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from _helpers import load_tool

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "function_lengths.py"

pytestmark = pytest.mark.skipif(not TOOL.is_file(), reason="needs the source tree")


def _tool():
    return load_tool("function_lengths")


RUST = """\
pub fn short(x: u32) -> u32 {
    let s = "}}}"; // }
    let c = '}';
    /* { */
    x + 1
}
pub(crate) unsafe fn long() {
BODY}
trait T { fn declared(&self); }
#[cfg(test)]
mod tests {
    fn hidden() {
BODY    }
}
"""


def test_lengths_by_ast_and_by_braces_outside_tests(tmp_path):
    body = "    let _ = 1;\n" * 130
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lib.rs").write_text(RUST.replace("BODY", body))
    py = "def f():\n" + "    x = 1\n" * 125 + "\n\ndef g():\n    pass\n"
    (tmp_path / "mod.py").write_text(py)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def t():\n" + "    x = 1\n" * 200)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tool = _tool()
    got = {(f.path, f.name): f.lines for f in tool.functions(tmp_path)}
    assert got == {
        ("src/lib.rs", "short"): 6,
        ("src/lib.rs", "long"): 132,
        ("mod.py", "f"): 126,
        ("mod.py", "g"): 2,
    }
    assert tool.main(["--root", str(tmp_path)]) == 1
    assert tool.main(["--root", str(tmp_path), "--limit", "200"]) == 0


def test_this_tree_has_no_function_over_the_limit():
    assert _tool().main([]) == 0
