"""Run every fuzz target for a while and report duration and execution count per target.

    python fuzz/run.py --seconds 600 --jobs 2          # the long runs
    python fuzz/run.py --seconds 10                    # the CI smoke
    python fuzz/run.py --seconds 60 --targets gguf_file,plan_file

Python targets (``fuzz/targets/fuzz_NAME.py``) run under atheris; Rust targets
(``fuzz/fuzz_targets/NAME.rs``) under ``cargo +nightly fuzz`` when cargo-fuzz and a nightly
toolchain are installed, and are skipped with a message otherwise (``--require-rust`` makes that
an error). Each target reads its committed seeds ``fuzz/seeds/NAME`` and grows a working corpus
in ``fuzz/corpus/NAME`` (not committed); a crashing, hanging or leaking input is written to
``fuzz/artifacts/NAME/`` and the run exits nonzero. Logs go to ``--log-dir``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PY_TARGETS = sorted(p.stem[len("fuzz_") :] for p in (ROOT / "targets").glob("fuzz_*.py"))
RS_TARGETS = sorted(p.stem for p in (ROOT / "fuzz_targets").glob("*.rs"))
_EXECS = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")


@dataclass
class Result:
    target: str
    kind: str
    seconds: float
    execs: int | None
    rc: int | None  # None: skipped
    log: Path

    @property
    def ok(self) -> bool:
        return self.rc in (0, None)


def rust_available() -> str | None:
    """Why the Rust targets cannot run here, or None when they can."""
    if shutil.which("cargo") is None:
        return "no cargo"
    for cmd, what in (
        (["cargo", "+nightly", "--version"], "no nightly toolchain"),
        (["cargo", "fuzz", "--version"], "cargo-fuzz is not installed"),
    ):
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return what
    return None


def libfuzzer_flags(name: str, seconds: int, timeout: int) -> list[str]:
    art = ROOT / "artifacts" / name
    art.mkdir(parents=True, exist_ok=True)
    return [
        f"-max_total_time={seconds}",
        f"-timeout={timeout}",
        "-rss_limit_mb=3072",
        "-print_final_stats=1",
        f"-artifact_prefix={art}/",
    ]


def run_one(name: str, kind: str, seconds: int, timeout: int, log_dir: Path) -> Result:
    corpus = ROOT / "corpus" / name
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = ROOT / "seeds" / name
    flags = libfuzzer_flags(name, seconds, timeout)
    if kind == "python":
        cmd = [sys.executable, str(ROOT / "targets" / f"fuzz_{name}.py"), *flags]
        cmd += [str(corpus), str(seeds)]
    else:
        cmd = ["cargo", "+nightly", "fuzz", "run", "-O", "-a", name, str(corpus), str(seeds)]
        cmd += ["--", *flags]
    log = log_dir / f"{name}.log"
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    scratch = tempfile.mkdtemp(prefix=f"pirs-fuzz-{name}-", dir=shm)
    env = {**os.environ, "POWERINFER_FUZZ_TMP": scratch}
    t0 = time.monotonic()
    try:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT
            ).returncode
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - t0
    text = log.read_text(errors="replace")
    m = _EXECS.search(text) or _DONE.search(text)
    execs = int(m.group(1)) if m else None
    return Result(name, kind, elapsed, execs, rc, log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=10, help="fuzzing time per target")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take")
    ap.add_argument("--jobs", type=int, default=1, help="targets run at a time")
    ap.add_argument("--targets", help="comma-separated names (default: all)")
    ap.add_argument("--python-only", action="store_true")
    ap.add_argument("--rust-only", action="store_true")
    ap.add_argument("--require-rust", action="store_true", help="fail when Rust cannot run")
    ap.add_argument("--log-dir", default=str(ROOT / "out"), help="one log per target")
    a = ap.parse_args(argv)
    todo = [] if a.rust_only else [(t, "python") for t in PY_TARGETS]
    if not a.python_only:
        why = rust_available()
        if why is None:
            build = subprocess.run(["cargo", "+nightly", "fuzz", "build", "-O", "-a"], cwd=ROOT)
            if build.returncode != 0:
                print("cargo fuzz build failed", file=sys.stderr)
                return 1
            todo += [(t, "rust") for t in RS_TARGETS]
        elif a.require_rust:
            print(f"Rust fuzz targets cannot run: {why}", file=sys.stderr)
            return 1
        else:
            print(f"skipping the Rust fuzz targets {RS_TARGETS}: {why}")
    if a.targets:
        wanted = set(a.targets.split(","))
        unknown = wanted - set(PY_TARGETS) - set(RS_TARGETS)
        if unknown:
            print(f"unknown targets {sorted(unknown)}", file=sys.stderr)
            return 2
        todo = [(t, k) for t, k in todo if t in wanted]
    log_dir = Path(a.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    env_note = f"{a.seconds} s per target, {a.jobs} at a time, logs in {log_dir}"
    print(f"fuzzing {len(todo)} targets: {env_note}", flush=True)
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futures = [pool.submit(run_one, t, k, a.seconds, a.timeout, log_dir) for t, k in todo]
        results = []
        for fut in futures:
            r = fut.result()
            results.append(r)
            state = "ok" if r.ok else f"FINDING (rc {r.rc}, see {r.log})"
            print(
                f"{r.kind:6} {r.target:18} {r.seconds:7.1f} s {r.execs or 0:>10} execs  {state}",
                flush=True,
            )
    bad = [r for r in results if not r.ok]
    print(f"{len(results) - len(bad)}/{len(results)} targets without findings")
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
