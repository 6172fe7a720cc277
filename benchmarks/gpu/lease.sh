#!/usr/bin/env bash
# One call on a lent GPU machine (issue 33), within a time budget: probe the machine (GPU, driver,
# NVRTC, measured device-to-device bandwidth), then in parallel build llama.cpp's llama-bench with
# CUDA for sm_90 (from a trimmed copy of its source, .peer/lcpp.tgz, when carried) and write the
# synthetic 7B-shape GGUFs, while benchmarks/gpu/check.sh runs the correctness steps (kernel
# tests, executor tests, pytest's hybrid tests on the device); then compute-sanitizer memcheck,
# the 7B decode benchmark (hybrid, CPU-only, llama.cpp -ngl at the same VRAM budget; Q4_0, then
# F16 and the whole model on the GPU as time allows) and racecheck with what time is left. Every
# log goes into one archive, $OUT/logs.tgz (the device tool brings back at most 8 files); the
# summary is printed last.
#
# Build here first: benchmarks/gpu/build_artifacts.sh (wheel + test binaries); carry
# target/gpu-artifacts, .peer (the trimmed llama.cpp source) and .whl (the device image lacks the
# wheels gguf and highspy). Usage on the device:
#   LEASE_BUDGET=450 [LEASE_BENCH="q4_0 fit fit_graphs fit_nogather ncu f16 powerinfer"] \
#       [LEASE_LAYERS=32] \
#       [LEASE_FIT_LAYERS=32] \
#       [LEASE_SPARSITY=exact-relu|predictor|dense] [LEASE_SANITIZERS=0] [LEASE_CHECK=0] \
#       [LEASE_PROFILE_TOKENS=N] \
#       bash benchmarks/gpu/lease.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
T0=$(date +%s)
BUDGET=${LEASE_BUDGET:-450}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
FINAL=${OUT:-target/gpu-lease}
W=/tmp/lease
rm -rf "$W" && mkdir -p "$W" "$FINAL"
export PYTHONUNBUFFERED=1
PY=python3
ART=target/gpu-artifacts
MODELS=/tmp/models
THREADS=$(nproc)
SUMMARY=$W/summary.txt
note() { echo "$*" | tee -a "$SUMMARY"; }
finish() {
    note "lease: $(($(date +%s) - T0)) s used of $BUDGET"
    case $FINAL in /*) ;; *) FINAL=$ROOT/$FINAL ;; esac
    (cd /tmp && tar czf "$FINAL/logs.tgz" --exclude=lease/check/site lease)
    echo
    echo "== summary"
    cat "$SUMMARY"
    [ -f "$W/check/summary.txt" ] && cat "$W/check/summary.txt"
    exit 0
}

echo "== probe"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free,clocks.sm,clocks.mem --format=csv
    nvcc --version | tail -n 2
    ls -la /usr/local/cuda/lib64/libnvrtc.so* 2>&1 | head -n 4
    $PY --version
    echo "cores $THREADS"
    free -g | head -n 2
    df -h /tmp | tail -n 1
    $PY - <<'EOF'
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    y.copy_(x)
e.record()
torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(f"device copy: {2 * x.numel() / ms / 1e6:.0f} GB/s (read + write, 2 GiB, 20 copies)")
EOF
} >"$W/env.txt" 2>&1
cat "$W/env.txt"
grep "device copy" "$W/env.txt" >>"$SUMMARY"

# Our wheel, and the wheels of its dependencies that the device image lacks (gguf, highspy),
# carried in .whl (the device has no registry).
SITE=/tmp/site
$PY -m pip install -q --no-index --no-deps --target "$SITE" "$(ls $ART/*.whl | head -n 1)" \
    $(ls .whl/*.whl 2>/dev/null) >"$W/pip.log" 2>&1 || note "pip install failed: $(tail -n 3 "$W/pip.log")"
export PYTHONPATH=$SITE

# Which benchmarks: q4_0 and f16 (7B shape at 40% of its bytes, with llama.cpp), fit (Q4_0, the
# whole model on the GPU, LEASE_FIT_LAYERS layers of the 7B shape) and ncu (the fit model's
# kernels under Nsight Compute: per-kernel GB/s against the measured copy rate, ncu_table.py).
# LEASE_LAYERS: layers of the q4_0/f16 models (fewer: quicker to write and, in predictor mode,
# to profile and train); LEASE_SPARSITY: exact-relu (default), dense or predictor.
BENCHES=${LEASE_BENCH:-q4_0 fit f16}
FIT_LAYERS=${LEASE_FIT_LAYERS:-32}
LAYERS=${LEASE_LAYERS:-32}
SPARSITY=${LEASE_SPARSITY:-exact-relu}
has() { case " $BENCHES " in *" $1 "*) return 0 ;; esac; return 1; }
LPID=
if [ -f .peer/lcpp.tgz ] && { has q4_0 || has f16; }; then
    (
        tar xzf .peer/lcpp.tgz -C /tmp && cd /tmp/lcpp &&
            cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_NATIVE=ON \
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
                -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF &&
            cmake --build b -j "$((THREADS - 2))" --target llama-bench
    ) >"$W/llama_build.log" 2>&1 &
    LPID=$!
fi
# PowerInfer's CUDA build of main (from a trimmed copy of its source, .peer/powerinfer.tgz:
# the top-level ggml/llama sources, CMakeLists.txt, cmake/, common/, scripts/build-info*,
# pocs/ (empty CMakeLists.txt), examples/main and examples/llama-bench with an
# examples/CMakeLists.txt of just those two; see benchmarks/gpu/NOTES.md).
PPID_PI=
if [ -f .peer/powerinfer.tgz ] && has powerinfer; then
    (
        tar xzf .peer/powerinfer.tgz -C /tmp && cd /tmp/pi &&
            cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CUBLAS=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF \
                -DLLAMA_BUILD_SERVER=OFF &&
            cmake --build b -j "$((THREADS - 2))" --target main
    ) >"$W/powerinfer_build.log" 2>&1 &
    PPID_PI=$!
elif has powerinfer; then
    note "PowerInfer: no .peer/powerinfer.tgz carried (its source, trimmed: benchmarks/gpu/NOTES.md)"
fi
synth() { # synth DTYPE LAYERS: write the 7B-shape GGUF of DTYPE into $MODELS
    cd benchmarks && $PY -c "
from pathlib import Path
from _bench_common import synthetic_gguf
from bench_hybrid import LLAMA7B
print(synthetic_gguf(Path('$MODELS'), '$1', shape={**LLAMA7B, 'layers': $2}, seed=0))"
}
SQ= SF= SFIT=
FITS=0
{ has fit || has fit_graphs || has fit_nogather || has ncu; } && FITS=1
if has q4_0 || { [ $FITS = 1 ] && [ "$FIT_LAYERS" = "$LAYERS" ]; }; then
    synth Q4_0 "$LAYERS" >"$W/synth_q4_0.log" 2>&1 &
    SQ=$!
fi
if [ $FITS = 1 ] && [ "$FIT_LAYERS" != "$LAYERS" ]; then
    synth Q4_0 "$FIT_LAYERS" >"$W/synth_fit.log" 2>&1 &
    SFIT=$!
fi
if has f16; then
    synth F16 "$LAYERS" >"$W/synth_f16.log" 2>&1 &
    SF=$!
fi

if [ "${LEASE_CHECK:-1}" = 1 ]; then
    echo "== correctness (check.sh, $(left) s left)"
    STEP_TIMEOUT=${STEP_TIMEOUT:-150} CHECK_SANITIZERS=0 OUT=$W/check bash benchmarks/gpu/check.sh --device cuda --quick \
        --artifacts $ART >"$W/check.log" 2>&1
    tail -n 30 "$W/check.log"
else
    note "correctness: skipped (LEASE_CHECK=0)"
fi

sanitize() {
    local tool=$1 t=$2
    [ "$t" -lt 20 ] && { note "compute-sanitizer $tool: skipped (time)"; return; }
    timeout "$t" compute-sanitizer --tool "$tool" --error-exitcode 1 $ART/bin/gpu_kernels \
        --test-threads 1 >"$W/sanitizer_$tool.log" 2>&1
    local rc=$?
    note "compute-sanitizer $tool: rc $rc$([ $rc = 124 ] && echo " (timed out after $t s)") $(grep -E "ERROR SUMMARY|test result" "$W/sanitizer_$tool.log" | tr '\n' ' ')"
}
[ "${LEASE_SANITIZERS:-1}" = 1 ] && sanitize memcheck 100

bench() { # bench NAME TIMEOUT ARGS...
    local name=$1 t=$2
    shift 2
    [ "$t" -lt 30 ] && { note "bench $name: skipped (time)"; return; }
    timeout "$t" $PY benchmarks/bench_hybrid.py --device cuda --model-dir $MODELS --tokens 32 \
        --repeats 3 --threads "$THREADS" --json "$W/bench_$name.json" "$@" >"$W/bench_$name.log" 2>&1
    local rc=$?
    note "bench $name: rc $rc"
    [ $rc != 0 ] && tail -n 6 "$W/bench_$name.log" | tee -a "$SUMMARY"
    sed -n '/^Hybrid decode/,$p' "$W/bench_$name.log" | tee -a "$SUMMARY"
}
echo "== 7B benchmark ($(left) s left)"
wait_for() { [ -n "$1" ] && timeout "$2" tail --pid="$1" -f /dev/null; }
LB=()
if [ -n "$LPID" ]; then
    wait_for $LPID $(($(left) - 200))
    if [ -x /tmp/lcpp/b/bin/llama-bench ]; then
        LB=(--llama-bench /tmp/lcpp/b/bin/llama-bench)
    else
        note "llama-bench: not built in time ($(tail -n 2 "$W/llama_build.log" | tr '\n' ' '))"
    fi
fi
if has q4_0; then
    wait_for "$SQ" $(($(left) - 150))
    note "synthetic Q4_0: $(tail -n 2 "$W/synth_q4_0.log" | tr '\n' ' ')"
    # What the later steps need kept back (predictor mode profiles and trains first: ~30 s a
    # layer of the 7B width on 16 cores, so it gets all the rest when nothing follows).
    later=15
    has fit && later=$((later + 60))
    has ncu && later=$((later + 60))
    has f16 && later=$((later + 90))
    has powerinfer && later=$((later + 150))
    [ "${LEASE_SANITIZERS:-1}" = 1 ] && later=$((later + 30))
    bench q4_0 $(($(left) - later)) --dtype Q4_0 --layers "$LAYERS" --sparsity "$SPARSITY" \
        ${LEASE_PROFILE_TOKENS:+--profile-tokens "$LEASE_PROFILE_TOKENS"} "${LB[@]}"
fi
if has fit; then
    wait_for "${SFIT:-$SQ}" $(($(left) - 60))
    bench fit $(($(left) - 40)) --dtype Q4_0 --budget-share 1.0 --layers "$FIT_LAYERS"
fi
if has fit_graphs; then  # the same with each batch of launches run as a CUDA graph (graph.rs)
    wait_for "${SFIT:-$SQ}" $(($(left) - 60))
    POWERINFER_RS_GPU_GRAPHS=1 bench fit_graphs $(($(left) - 40)) --dtype Q4_0 \
        --budget-share 1.0 --layers "$FIT_LAYERS"
fi
if has fit_nogather; then  # the same without the lists gathered on the GPU (compact.cu)
    wait_for "${SFIT:-$SQ}" $(($(left) - 60))
    POWERINFER_RS_GPU_GATHER=0 bench fit_nogather $(($(left) - 40)) --dtype Q4_0 \
        --budget-share 1.0 --layers "$FIT_LAYERS"
fi
if has ncu; then  # per-kernel bandwidth of the model held whole (Nsight Compute)
    wait_for "${SFIT:-$SQ}" $(($(left) - 60))
    COPY=$(grep -o "device copy: [0-9]*" "$W/env.txt" | grep -o "[0-9]*$")
    timeout $(($(left) - 30)) ncu --clock-control none --csv --launch-skip 300 --launch-count 200 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        $PY benchmarks/bench_hybrid.py --device cuda --model-dir $MODELS --dtype Q4_0 \
        --budget-share 1.0 --layers "$FIT_LAYERS" --tokens 8 --repeats 1 --threads "$THREADS" \
        >"$W/ncu.csv" 2>&1
    note "ncu: rc $?"
    $PY benchmarks/gpu/ncu_table.py "$W/ncu.csv" ${COPY:+--copy-gbs "$COPY"} \
        --json "$W/ncu.json" 2>&1 | tee -a "$SUMMARY"
fi
if has f16; then
    wait_for "$SF" $(($(left) - 90))
    note "synthetic F16: $(tail -n 2 "$W/synth_f16.log" | tr '\n' ' ')"
    bench f16 $(($(left) - 10 - $(has powerinfer && echo 150 || echo 0))) --dtype F16 --layers "$LAYERS" --sparsity "$SPARSITY" \
        ${LEASE_PROFILE_TOKENS:+--profile-tokens "$LEASE_PROFILE_TOKENS"} "${LB[@]}"
fi
if has powerinfer; then  # ours against PowerInfer's CUDA build, one placement and budget
    PI_MAIN=
    if [ -n "$PPID_PI" ]; then
        wait_for $PPID_PI $(($(left) - 120))
        [ -x /tmp/pi/b/bin/main ] && PI_MAIN=/tmp/pi/b/bin/main
        [ -z "$PI_MAIN" ] && note "PowerInfer: not built ($(tail -n 3 "$W/powerinfer_build.log" | tr '\n' ' '))"
    fi
    if [ $(($(left) - 15)) -lt 30 ]; then
        note "bench powerinfer: skipped (time)"
    else
        timeout $(($(left) - 15)) $PY benchmarks/bench_powerinfer_gpu.py --device cuda \
            --cache $MODELS --shape "4096,11008,$LAYERS,32000" --dtypes q4_0 \
            --threads "$THREADS" ${PI_MAIN:+--powerinfer-main "$PI_MAIN"} \
            --json "$W/bench_powerinfer.json" >"$W/bench_powerinfer.log" 2>&1
        note "bench powerinfer: rc $?"
        tail -n 4 "$W/bench_powerinfer.log" | grep -E "Error|error" | tee -a "$SUMMARY"
        sed -n '/^Hybrid decode vs PowerInfer/,$p' "$W/bench_powerinfer.log" | tee -a "$SUMMARY"
    fi
fi
[ "${LEASE_SANITIZERS:-1}" = 1 ] && sanitize racecheck $(($(left) - 15))
finish
