#!/usr/bin/env bash
# Build, on a machine with Rust, what benchmarks/gpu/check.sh runs on a lent GPU machine that has
# none: the abi3 wheel (with the `cuda` feature, the default) and the test binaries of the
# workspace's crates (`cargo test --no-run`; check.sh runs those of the CUDA and engine crates),
# copied into one folder (default target/gpu-artifacts) small enough to carry.
#
# usage: build_artifacts.sh [OUT_DIR] [--wheel FILE] [--profile NAME] [--features LIST]
#   --wheel FILE     copy this wheel instead of building one (`.ci/run`: the wheel it tests)
#   --profile NAME   cargo profile of the test binaries: gpu-test (default; release with thin
#                    LTO, Cargo.toml), or test (`.ci/run`: the binaries its cargo test built)
#   --features LIST  features of the test binaries (`.ci/run`: those of its cargo test, so
#                    that nothing builds again)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=target/gpu-artifacts WHEEL="" PROFILE=gpu-test FEATURES=""
while [ $# -gt 0 ]; do
    case "$1" in
        --wheel) WHEEL=$2; shift 2 ;;
        --profile) PROFILE=$2; shift 2 ;;
        --features) FEATURES=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "build_artifacts.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
        *) OUT=$1; shift ;;
    esac
done
rm -rf "$OUT" && mkdir -p "$OUT/bin"

if [ -n "$WHEEL" ]; then
    echo "== wheel: $WHEEL"
    cp "$WHEEL" "$OUT/"
else
    echo "== wheel (release, abi3, cuda feature)"
    maturin build --release --out "$OUT" >/dev/null
fi

echo "== test binaries (profile $PROFILE${FEATURES:+, features $FEATURES})"
# The JSON lines name each test executable; keep the kernel, PTX and executor tests.
cargo test --profile "$PROFILE" --no-run --workspace --exclude powerinfer-py \
    ${FEATURES:+--features "$FEATURES"} --message-format=json 2>/dev/null \
    | python3 -c '
import json, shutil, sys
want = {"gpu_kernels", "nvrtc_ptx", "no_device", "hybrid", "session_consistency"}
got = set()
for line in sys.stdin:
    m = json.loads(line)
    exe, target = m.get("executable"), m.get("target", {})
    if exe and m.get("reason") == "compiler-artifact" and target.get("name") in want:
        shutil.copy(exe, sys.argv[1] + "/" + target["name"])
        got.add(target["name"])
        print("  ", target["name"])
if got != want:
    sys.exit(f"build_artifacts.sh: no test binary for {sorted(want - got)}")
' "$OUT/bin"
du -sh "$OUT"
