#!/usr/bin/env bash
# One call on a lent GPU machine (or, with --device gpu-sim, on any machine: CI runs it so): from
# prebuilt artifacts (benchmarks/gpu/build_artifacts.sh: the wheel and the test binaries; the GPU
# machine has no Rust and no package registry), probe the machine, find NVRTC, run the kernel
# tests, compute-sanitizer memcheck and racecheck over them, the executor tests, pytest's hybrid
# tests on the device, and the hybrid decode benchmark; end with a short table. Full logs go to
# $OUT (default target/gpu-check).
#
# Usage: check.sh [--device cuda|gpu-sim] [--artifacts DIR] [--quick] [--smoke]
#   --quick  the small hybrid benchmark instead of the 7B shape
#   --smoke  the plumbing only (what `.ci/run` checks on gpu-sim, where the suites have already
#            run): every test binary loads and lists its tests, one small test of each runs,
#            the wheel installs and imports, one hybrid test and the small benchmark run
# Environment: STEP_TIMEOUT (seconds per step, default none); CHECK_SANITIZERS=0, CHECK_RUST=0 skip
# those steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
DEVICE=cuda ART=target/gpu-artifacts QUICK=0 SMOKE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --artifacts) ART=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --smoke) SMOKE=1; QUICK=1; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-target/gpu-check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
declare -a ROWS
row() { ROWS+=("$(printf '%-34s %-6s %s' "$1" "$2" "$3")"); }
# run NAME LOG CMD...: run a step, log it, note pass/fail/skip.
run() {
    local name=$1 log=$OUT/$2; shift 2
    echo "== $name"
    local rc=0
    timeout "${STEP_TIMEOUT:-0}" "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" = 124 ]; then
        row "$name" FAIL "$(basename "$log") (timed out after ${STEP_TIMEOUT}s)"
        tail -n 15 "$log"
    elif [ "$rc" = 0 ]; then
        if grep -Eq "skipped: no CUDA device|cuda: skipped" "$log"; then
            row "$name" ok "$(basename "$log") (CUDA part skipped: no device)"
        else
            row "$name" ok "$(basename "$log")"
        fi
    else
        row "$name" FAIL "$(basename "$log") (tail below)"
        tail -n 15 "$log"
    fi
}

echo "== environment"
{
    date -u
    uname -a
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv 2>&1 || echo "no nvidia-smi"
    ls /usr/local/cuda/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* 2>/dev/null
    $PY --version
    nproc
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# NVRTC: our loader tries libnvrtc.so.13, .12 and .so, in NVRTC_LIB_DIR, on the search path and
# in the CUDA toolkit's directories; point NVRTC_LIB_DIR at the PyPI wheel when there is no
# toolkit.
if [ -z "${NVRTC_LIB_DIR:-}" ]; then
    d=$($PY -c "import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))" 2>/dev/null) && export NVRTC_LIB_DIR=$d
fi

if [ "$DEVICE" = "cuda" ] && ! nvidia-smi >/dev/null 2>&1; then
    echo "no GPU here: use --device gpu-sim" >&2
    exit 2
fi

BIN=$ART/bin
# --nocapture: the tests' own lines ("skipped: no CUDA device", "<test> <format>: ok on <device>")
# reach the logs.
[ "${CHECK_RUST:-1}" = 0 ] && BIN=/nonexistent && row "rust tests" skip "CHECK_RUST=0"
# --smoke: each binary's one small test (by exact name), after it lists its tests.
declare -A SMOKE_TEST=(
    [nvrtc_ptx]=compile_errors_carry_the_nvrtc_log
    [gpu_kernels]=elementwise
    [no_device]=""
    [hybrid]=transfers_are_counted_per_layer
    [session_consistency]=prefill_equals_token_by_token
)
# rust_test NAME: the binary's tests (all of them, or --smoke's one after listing them all).
rust_test() {
    local t=$1
    [ -x "$BIN/$t" ] || return 0
    if [ "$SMOKE" = 1 ]; then
        run "rust: $t loads" "rust_${t}_list.log" "$BIN/$t" --list
        run "rust: $t ${SMOKE_TEST[$t]:-(all)}" "rust_$t.log" "$BIN/$t" ${SMOKE_TEST[$t]:+--exact} \
            ${SMOKE_TEST[$t]} --test-threads 1 --nocapture
    else
        run "rust: $t" "rust_$t.log" "$BIN/$t" --test-threads 1 --nocapture
    fi
}
for t in nvrtc_ptx gpu_kernels no_device; do
    rust_test "$t"
done
# Every weight format the GPU kernels take (GPU_DTYPES in crates/cuda/src/kernels.rs) must have
# passed the row kernels on the device: sparse_matvec and axpy_rows in each, the hot-slab FFN in
# each but F32 (gpu_kernels prints one line per test and format).
GPU_FORMATS="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K"
if [ "$DEVICE" = "cuda" ] && [ -f "$OUT/rust_gpu_kernels.log" ]; then
    missing=""
    for f in $GPU_FORMATS; do
        for t in sparse_matvec axpy_rows hot_ffn; do
            [ "$t/$f" = "hot_ffn/F32" ] && continue
            grep -q "^$t $f: ok on cuda" "$OUT/rust_gpu_kernels.log" || missing="$missing $t/$f"
        done
    done
    if [ -z "$missing" ]; then
        row "rust: gpu formats on cuda" ok "$(echo $GPU_FORMATS | wc -w) formats (rust_gpu_kernels.log)"
    else
        row "rust: gpu formats on cuda" FAIL "not checked on the device:$missing"
    fi
fi
if [ "${CHECK_SANITIZERS:-1}" = 0 ] || [ "$SMOKE" = 1 ]; then
    row "compute-sanitizer" skip "CHECK_SANITIZERS=0 or --smoke"
elif [ "$DEVICE" = "cuda" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck; do
        run "compute-sanitizer $tool" "sanitizer_$tool.log" \
            compute-sanitizer --tool "$tool" --error-exitcode 1 "$BIN/gpu_kernels" --test-threads 1
    done
elif [ "$DEVICE" = "cuda" ]; then
    row "compute-sanitizer" skip "not installed"
fi
for t in hybrid session_consistency; do
    rust_test "$t"
done

# The wheel into a private folder (no registry needed: its Python dependencies are numpy and
# friends, already on the device image).
WHEEL=$(ls "$ART"/*.whl 2>/dev/null | head -n 1)
if [ -n "$WHEEL" ]; then
    SITE=$OUT/site
    rm -rf "$SITE" && $PY -m pip install -q --no-deps --target "$SITE" "$WHEEL" >"$OUT/pip.log" 2>&1
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    export POWERINFER_RS_TEST_DEVICES=$DEVICE
    if [ "$SMOKE" = 1 ]; then
        run "pytest: one hybrid test on $DEVICE" "pytest_hybrid.log" \
            $PY -m pytest -q -p no:cacheprovider \
            "tests/test_hybrid.py::test_greedy_decoding_is_bit_identical_across_runs"
    else
        run "pytest: hybrid on $DEVICE" "pytest_hybrid.log" \
            $PY -m pytest -q -p no:cacheprovider tests/test_hybrid.py \
            tests/test_hybrid_families.py tests/test_hybrid_moe.py tests/test_kv_cache.py
    fi
    if [ "$QUICK" = 1 ] || [ "$DEVICE" = "gpu-sim" ]; then
        run "bench: hybrid decode (small)" "bench_hybrid.log" \
            $PY benchmarks/bench_hybrid.py --device "$DEVICE" --small --json "$OUT/bench_hybrid.json"
    else
        run "bench: hybrid decode (7B shape)" "bench_hybrid.log" \
            $PY benchmarks/bench_hybrid.py --device "$DEVICE" --json "$OUT/bench_hybrid.json"
    fi
else
    row "wheel" skip "none in $ART"
fi

echo
echo "== summary ($DEVICE; logs in $OUT)"
printf '%s\n' "${ROWS[@]}" | tee "$OUT/summary.txt"
[ -f "$OUT/bench_hybrid.log" ] && tail -n 12 "$OUT/bench_hybrid.log"
! grep -q " FAIL " "$OUT/summary.txt"
