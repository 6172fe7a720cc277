#!/usr/bin/env bash
# The CUDA kernels without a GPU: builds the emulator (crates/cuda, feature `emu`: the real
# kernels/*.cu compiled for the host, each CUDA thread a fiber) and runs its tests:
#   - crates/cuda/tests/gpu_kernels.rs  each kernel against scalar / float64 references, one
#                                       body on the host backend and the emulator (every f16
#                                       bit pattern, rows past MAX_X_COLS, head dims to 256)
#   - crates/cuda/tests/emu_kernels.rs  every entry x every GPU format against float64, shapes
#                                       at the kernels' edges, the set of entries run ==
#                                       ops::SOURCES; launches CUDA refuses are errors
#   - crates/cuda/tests/emu_deadlock.rs a barrier part of a block never reaches: an error
#   - crates/engine/tests/hybrid.rs     the hybrid executor on gpu-sim and gpu-emu, one body;
#                                       four of them again with graphs on
#                                       (POWERINFER_RS_GPU_GRAPHS=1: crates/cuda/src/graph.rs)
#
# usage: bash benchmarks/gpu/emu.sh [--sanitize address|thread] [--graphs] [--quick]
#   (none)              the kernel tests, the hybrid tests, and the graphs run (plain; `.ci/run`
#                       runs the plain tests in its `cargo test`, which has the emulator)
#   --graphs            only the hybrid tests with graphs on (what `.ci/run` adds)
#   --sanitize address  the kernels built with AddressSanitizer and UndefinedBehaviorSanitizer
#                       (every device buffer and shared array is its own exact-size allocation,
#                       so a read past one is reported)
#   --sanitize thread   the kernels built with ThreadSanitizer (races between CUDA threads: a
#                       missing __syncthreads, an atomic written as a plain add)
#   --quick             the kernel tests only (not the hybrid executor)
# Sanitized, the kernel tests run on the emulator alone (the host backend's Rust is not
# instrumented) over the shapes that reach every code path, not every size the plain run checks
# (`powerinfer_cuda::EMU_SANITIZER`; the tests say what they skip).
# Exits non-zero on any test failure or sanitizer report.
#
# One target directory and one set of features for every mode, the same as `.ci/run`'s
# `cargo test`: crates/cuda/build.rs reads POWERINFER_EMU_SANITIZE and links the sanitizer's
# runtime itself, so a sanitizer rebuilds powerinfer-cuda and its dependents, not every crate.
# A plain build after a sanitized one rebuilds them again.
set -euo pipefail
cd "$(dirname "$0")/../.."

SAN=""
QUICK=0
GRAPHS_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --sanitize) SAN=${2:-}; shift 2 ;;
        --sanitize=*) SAN=${1#*=}; shift ;;
        --graphs) GRAPHS_ONLY=1; shift ;;
        --quick) QUICK=1; shift ;;
        -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "emu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

# The sanitizer's runtime is preloaded into the test binaries only (cargo's runner), so that it
# comes first in the library list as the sanitizers require; cargo, rustc and cc run without it.
CC_BIN=${CXX:-g++}
runtime() { "$CC_BIN" -print-file-name="$1"; }
case "$SAN" in
    "") ;;
    address)
        export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_PRELOAD=$(runtime libasan.so)"
        # Leaks are not what this looks for (the emulator's thread pool lives for the process).
        export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
        export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
        ;;
    thread)
        export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_PRELOAD=$(runtime libtsan.so)"
        # tsan.supp: races involving Rust's uninstrumented standard library (see the file).
        export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$PWD/benchmarks/gpu/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
        ;;
    *) echo "emu.sh: --sanitize takes address or thread, not '$SAN'" >&2; exit 2 ;;
esac
# Set only for a sanitizer: build.rs reruns when it changes, and empty is not unset to cargo.
if [ -n "$SAN" ]; then export POWERINFER_EMU_SANITIZE=$SAN; else unset POWERINFER_EMU_SANITIZE; fi
# Sanitized runs are slower: give the emulator's barriers more time before calling a hang.
export POWERINFER_EMU_TIMEOUT_S=${POWERINFER_EMU_TIMEOUT_S:-300}
# The features of `.ci/run`'s cargo test (the workspace with the emulator), so that nothing
# outside powerinfer-cuda and its dependents builds again.
FEATURES=(--workspace --exclude powerinfer-py --features powerinfer-cuda/emu,powerinfer-engine/emu)

if [ "$GRAPHS_ONLY" = 0 ]; then
    echo "== gpu-emu kernel tests (${SAN:-no sanitizer})"
    cargo test "${FEATURES[@]}" --test gpu_kernels --test emu_kernels --test emu_deadlock
fi
if [ "$QUICK" = 0 ] && [ "$GRAPHS_ONLY" = 0 ]; then
    echo "== the hybrid executor on gpu-sim and gpu-emu (${SAN:-no sanitizer})"
    cargo test "${FEATURES[@]}" --test hybrid
fi
if [ "$QUICK" = 0 ] && [ -z "$SAN" ]; then
    # The tests whose batches change most from token to token (the attention's chunking
    # over long contexts, predicted and thresholded active sets, rollback); pytest's
    # test_graphs_give_the_same_bits covers the rest on gpu-emu.
    echo "== with graphs on: launches batched between host interactions"
    POWERINFER_RS_GPU_GRAPHS=1 cargo test "${FEATURES[@]}" --test hybrid -- long_contexts \
        predictor_mode_on_either_side threshold_mode_on_a_silu_model truncation_rollback
fi
echo "== gpu-emu: passed (${SAN:-no sanitizer})"
