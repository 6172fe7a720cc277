#!/usr/bin/env bash
# Build, on a machine with Rust, what benchmarks/gpu/check.sh runs on a lent GPU machine that has
# none: the abi3 wheel (with the `cuda` feature, the default) and the test binaries of the CUDA
# and engine crates (`cargo test --no-run`), copied into one folder (default
# target/gpu-artifacts) small enough to carry. Usage: build_artifacts.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-target/gpu-artifacts}
rm -rf "$OUT" && mkdir -p "$OUT/bin"

echo "== wheel (release, abi3, cuda feature)"
maturin build --release --out "$OUT" >/dev/null

echo "== test binaries (release)"
# The JSON lines name each test executable; keep the kernel, PTX and executor tests.
cargo test --release --no-run -p powerinfer-cuda -p powerinfer-engine --message-format=json 2>/dev/null \
    | python3 -c '
import json, shutil, sys
want = {"gpu_kernels", "nvrtc_ptx", "no_device", "hybrid", "session_consistency"}
for line in sys.stdin:
    m = json.loads(line)
    exe, target = m.get("executable"), m.get("target", {})
    if exe and m.get("reason") == "compiler-artifact" and target.get("name") in want:
        shutil.copy(exe, sys.argv[1] + "/" + target["name"])
        print("  ", target["name"])
' "$OUT/bin"
du -sh "$OUT"
