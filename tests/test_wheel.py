"""The installed wheel runs on the Linux machines people have: tagged manylinux2014
(manylinux_2_17), its extension needing no glibc symbol newer than 2.17 and no C++ runtime of
the host.

The wheel is the one .ci/run builds (`maturin build --release --zig`) and installs; pytest runs
against it. Run from a source tree (the extension copied into ./python), there is no installed
wheel to inspect and the test skips, unless POWERINFER_RS_REQUIRE_WHEEL_CHECK=1 (set by .ci/run)
makes that a failure. The ELF symbol versions are read with pyelftools, independently of the
check maturin makes while it builds.
"""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata
from pathlib import Path

import pytest

import powerinfer_rs
from powerinfer_rs import _core

REQUIRE = os.environ.get("POWERINFER_RS_REQUIRE_WHEEL_CHECK") == "1"

# The libraries manylinux2014 lets an extension link (PEP 599), those of this x86-64 build.
ALLOWED_NEEDED = {
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "libgcc_s.so.1",
}
GLIBC_MAX = (2, 17)


def _installed_wheel() -> tuple[metadata.Distribution, Path] | None:
    """The installed distribution and its extension, when the imported package is that one."""
    try:
        dist = metadata.distribution("powerinfer-rs")
    except metadata.PackageNotFoundError:
        return None
    ext = Path(_core.__file__).resolve()
    root = Path(str(dist.locate_file(""))).resolve()
    if root not in ext.parents or dist.read_text("WHEEL") is None:
        return None
    return dist, ext


@pytest.fixture(scope="module")
def wheel() -> tuple[metadata.Distribution, Path]:
    found = _installed_wheel()
    if found is None:
        msg = (
            f"powerinfer_rs is imported from {Path(powerinfer_rs.__file__).parent}, not from an "
            "installed wheel"
        )
        if REQUIRE:
            pytest.fail(msg + " (POWERINFER_RS_REQUIRE_WHEEL_CHECK=1)")
        pytest.skip(msg)
    if platform.machine() != "x86_64" or platform.system() != "Linux":
        pytest.skip("the manylinux2014 check covers the x86-64 Linux wheel")
    return found


def _tags(dist: metadata.Distribution) -> list[str]:
    text = dist.read_text("WHEEL") or ""
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def _elf_needs(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """``(DT_NEEDED libraries, {library: [symbol versions it needs]})`` of a shared object."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    needed: list[str] = []
    versions: dict[str, list[str]] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                needed += [t.needed for t in sec.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
            if isinstance(sec, GNUVerNeedSection):
                for verneed, auxes in sec.iter_versions():
                    versions.setdefault(verneed.name, []).extend(a.name for a in auxes)
    return needed, versions


def _glibc(version: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)*)", version)
    return None if m is None else tuple(int(p) for p in m.group(1).split("."))


def test_wheel_tag_is_manylinux2014(wheel):
    dist, _ = wheel
    tags = _tags(dist)
    assert tags, "the installed wheel's WHEEL file names no tag"
    for tag in tags:
        py, abi, plat = tag.split("-")
        assert abi == "abi3", f"{tag}: one abi3 wheel serves every Python >= 3.9"
        assert plat in ("manylinux2014_x86_64", "manylinux_2_17_x86_64"), (
            f"{tag}: the wheel must install on glibc 2.17 and later (build it with "
            "`maturin build --release --zig`)"
        )


def test_extension_needs_glibc_2_17_and_no_cpp_runtime(wheel):
    _, ext = wheel
    needed, versions = _elf_needs(ext)
    assert needed, f"{ext}: no DT_NEEDED entries read; not the extension?"
    extra = sorted(set(needed) - ALLOWED_NEEDED)
    assert not extra, f"{ext} links libraries outside manylinux2014: {extra}"
    assert not any("stdc++" in n or "c++" in n for n in needed), needed
    glibc = [v for lib in versions.values() for v in lib if _glibc(v) is not None]
    assert glibc, f"{ext}: no GLIBC symbol versions found"
    newest = max(glibc, key=_glibc)
    print(f"\n{ext.name}: newest glibc symbol version {newest}; links {sorted(set(needed))}")
    too_new = sorted({v for v in glibc if _glibc(v) > GLIBC_MAX}, key=_glibc)
    assert not too_new, f"{ext} needs glibc symbols newer than 2.17: {too_new}"
    others = {
        lib: vs for lib, vs in versions.items() if not lib.startswith(("libc.", "libm.", "libdl."))
    }
    for lib, vs in others.items():
        bad = [v for v in vs if v.startswith(("GLIBCXX", "CXXABI"))]
        assert not bad, f"{ext} needs C++ runtime symbols from {lib}: {bad}"


def test_wheel_carries_the_emulator(wheel):
    """The C++ of gpu-emu is inside the portable wheel too (libc++ linked in); the hybrid tests
    run it (tests/test_hybrid.py, device="gpu-emu")."""
    assert _core.built_with_emu, "the installed wheel was built without the emu feature"
