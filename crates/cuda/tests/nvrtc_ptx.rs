//! Every kernel source compiles through NVRTC to PTX for the architectures we ship for and to
//! cubins for exact ones, the PTX exports every kernel, and every launch spec packs as many
//! arguments, of the same widths, as its kernel's PTX declares. Needs libnvrtc (CUDA 12 or 13) but no GPU:
//! found through `NVRTC_LIB_DIR`, the PyPI wheel `nvidia-cuda-nvrtc-cu12` (asked of `python3`),
//! or the system search path; skipped with a printed reason when none is found.

#![cfg(feature = "cuda")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

mod support;
use support::find_nvrtc;

use powerinfer_core::RopeFreqs;
use powerinfer_cuda::launch_spec::LaunchSpec;
use powerinfer_cuda::ops;
use powerinfer_cuda::ops::attention::launch::{AttentionDecode, AttentionMerge, KvStore};
use powerinfer_cuda::ops::axpy::launch::{AddSplits, AxpyRows};
use powerinfer_cuda::ops::compact::launch::{CompactFlags, CompactNonzero};
use powerinfer_cuda::ops::elementwise::launch::{Pair, PairKernel, ValueKernel, WithValue};
use powerinfer_cuda::ops::moe::launch::{ExpertFlags, ExpertScale, Routing};
use powerinfer_cuda::ops::norm_rope::launch::{Norm, Rope};
use powerinfer_cuda::ops::predictor::launch::PredictorFc2;
use powerinfer_cuda::ops::rows::launch::{GateUp, QuantizeX, SparseMatvec};
use powerinfer_cuda::{
    kernels, nvrtc, Act, Backend, FfnAct, HostBackend, HostBuf, Kernel, KvElem, RowLayout, XArg,
    GPU_DTYPES,
};

/// The PTX of `src` for `arch`, compiled once per process: the tests below ask for the same
/// modules (every module for compute_80 three times), and each compile takes seconds.
fn ptx(src: &kernels::KernelSource, arch: u32) -> Arc<str> {
    type Slot = Arc<OnceLock<Arc<str>>>;
    static PTX: OnceLock<Mutex<HashMap<(&'static str, u32), Slot>>> = OnceLock::new();
    let slot = PTX
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry((src.name, arch))
        .or_default()
        .clone();
    slot.get_or_init(|| {
        nvrtc::compile(src.name, &src.program(), arch)
            .unwrap_or_else(|e| panic!("{e}"))
            .into()
    })
    .clone()
}

/// Architectures compiled in CI (Ampere and Hopper; sm_75 Turing as the oldest we name).
const ARCHS: [u32; 3] = [75, 80, 90];

#[test]
fn compile_all_kernels_to_ptx() {
    if !find_nvrtc() {
        return;
    }
    let (major, minor) = nvrtc::nvrtc_version().unwrap();
    println!("NVRTC {major}.{minor}");
    let jobs = support::module_jobs(&ARCHS);
    let checked: usize = support::par_map(&jobs, |&(arch, src)| {
        let ptx = ptx(src, arch);
        assert!(
            ptx.contains(&format!(".target sm_{arch}")),
            "{}: PTX for the wrong target",
            src.name
        );
        for entry in src.entries() {
            assert!(
                ptx.contains(&format!(".entry {entry}(")),
                "{} (compute_{arch}): no .entry {entry}",
                src.name
            );
        }
        src.entries().len()
    })
    .into_iter()
    .sum();
    println!(
        "checked {checked} entries over {} architectures",
        ARCHS.len()
    );
}

#[test]
fn compile_errors_carry_the_nvrtc_log() {
    if !find_nvrtc() {
        return;
    }
    let err = nvrtc::compile(
        "broken",
        "extern \"C\" __global__ void k() { undefined_x(); }",
        80,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("broken.cu") && msg.contains("undefined_x"),
        "{msg}"
    );
    assert!(matches!(err, powerinfer_core::Error::Cuda(_)));
}

/// The byte size of every parameter of every `.entry` in `ptx`, in order.
fn ptx_params(ptx: &str) -> HashMap<String, Vec<usize>> {
    let mut out = HashMap::new();
    for chunk in ptx.split(".entry ").skip(1) {
        let name = chunk.split('(').next().unwrap_or("").trim().to_string();
        let params = chunk.split(')').next().unwrap_or("");
        let sizes = params
            .split(".param ")
            .skip(1)
            .map(|p| {
                if let Some(n) = p.split('[').nth(1) {
                    n.split(']').next().unwrap().parse().unwrap()
                } else if p.starts_with(".u64") || p.starts_with(".b64") || p.starts_with(".f64") {
                    8
                } else {
                    4
                }
            })
            .collect();
        out.insert(name, sizes);
    }
    out
}

/// The launch spec of every entry (per-format kernels in every GPU format), built by the one
/// launch description CudaDevice and the emulator use, over host-backend buffers.
fn every_spec() -> Vec<LaunchSpec> {
    let dev = HostBackend::new();
    let f = |n| dev.zeros::<f32>(n).unwrap();
    let i = |n| dev.zeros::<i32>(n).unwrap();
    let (w, x, idx) = (dev.zeros::<u8>(4096).unwrap(), f(64), i(8));
    let l = RowLayout::dense(8, 128).unwrap();
    let mut out = Vec::new();
    for dtype in GPU_DTYPES {
        let (mut y, flags) = (f(64), i(64));
        // The quantized formats read x quantized (any u8 buffer will do for a spec).
        let xa = || match dtype.is_quantized() {
            true => XArg::Quant(&w),
            false => XArg::F32(&x),
        };
        let launch = SparseMatvec {
            dtype,
            w: &w,
            l,
            x: xa(),
            cols: 64,
            idx: Some(&idx),
            n: 8,
            ids: Some((&w, l)),
            flags: Some(&flags),
            act: Act::Silu,
            accumulate: false,
            y: &mut y,
        };
        out.push(launch.spec(&dev).unwrap());
        let launch = GateUp {
            dtype,
            w: &w,
            gate_l: l,
            up_l: Some(l),
            x: xa(),
            cols: 64,
            idx: None,
            n: 8,
            ids_l: l,
            flags: None,
            bias: Some(&x),
            up_bias: Some(&x),
            act: FfnAct {
                relu_threshold: 0.25,
                up_act: true,
                ..FfnAct::from(Act::Relu)
            },
            count: Some(&idx),
            h: &mut y,
        };
        out.push(launch.spec(&dev).unwrap());
        let mut part = f(128);
        let launch = AxpyRows {
            dtype,
            w: &w,
            l,
            cols: 64,
            idx: None,
            a: &x,
            n: 8,
            count: Some(&idx),
            part: Some(&mut part),
            y: &mut y,
            splits: 2,
        };
        out.push(launch.spec(&dev).unwrap());
        let mut fl = i(64);
        let launch = PredictorFc2 {
            dtype,
            fc2_t: &w,
            l,
            hidden: &x,
            rank: 8,
            ffn: 64,
            threshold: 0.5,
            flags: &mut fl,
            logits: Some(&mut y),
        };
        out.push(launch.spec(&dev).unwrap());
    }
    let mut xq = dev.zeros::<u8>(160).unwrap();
    let launch = QuantizeX {
        x: &x,
        cols: 64,
        xq: &mut xq,
    };
    out.push(launch.spec(&dev).unwrap());
    let mut c = f(64);
    // rms_norm, then layer_norm.
    for bias in [None, Some(&x)] {
        let launch = Norm {
            x: &x,
            w: &x,
            bias,
            rows: 1,
            n: 64,
            eps: 1e-5,
            out: &mut c,
            xq: None,
        };
        out.push(launch.spec(&dev).unwrap());
    }
    let mut k = dev.zeros::<f32>(32).unwrap();
    let launch = Rope {
        x: &mut c,
        n_heads: 2,
        k: Some(&mut k),
        k_heads: 1,
        head_dim: 32,
        pos: 3,
        freqs: &RopeFreqs::plain(vec![1.0; 16]),
        neox: true,
        x_norm: Some(&x),
        k_norm: Some(&x),
        eps: 1e-6,
    };
    out.push(launch.spec(&dev).unwrap());
    out.extend(kv_specs::<u16>(&dev, &x, &mut c));
    out.extend(kv_specs::<f32>(&dev, &x, &mut c));
    for op in [Pair::Add, Pair::Copy] {
        let (y, x) = (&mut c, &x);
        out.push(PairKernel { op, y, x, n: 64 }.spec(&dev).unwrap());
    }
    for op in [
        WithValue::ThresholdMask,
        WithValue::Softcap,
        WithValue::Fill,
    ] {
        let (y, v) = (&mut c, 0.5);
        out.push(ValueKernel { op, y, n: 64, v }.spec(&dev).unwrap());
    }
    let mut flags = dev.zeros::<i32>(64).unwrap();
    let routing = || Routing {
        w: &x,
        expert_ffn: 8,
        routed: 56,
        n_expert: 7,
    };
    let launch = ExpertFlags {
        routing: routing(),
        n: 64,
        flags: &mut flags,
    };
    out.push(launch.spec(&dev).unwrap());
    let slabs = dev.zeros::<u8>(256).unwrap();
    let launch = ExpertScale {
        slabs: &slabs,
        ids_l: RowLayout::dense(64, 4).unwrap(),
        routing: routing(),
        n: 64,
        h: &mut c,
    };
    out.push(launch.spec(&dev).unwrap());
    let (part, count) = (f(128), i(1));
    let launch = AddSplits {
        part: &part,
        splits: 2,
        cols: 64,
        count: Some(&count),
        n: 64,
        y: &mut c,
    };
    out.push(launch.spec(&dev).unwrap());
    let (mut oi, mut oa, mut oc) = (i(64), f(64), i(1));
    let launch = CompactNonzero {
        a: &x,
        idx: Some(&idx),
        count_in: Some(&count),
        n: 8,
        out_idx: &mut oi,
        out_a: &mut oa,
        count: &mut oc,
    };
    out.push(launch.spec(&dev).unwrap());
    let flags = i(64);
    let launch = CompactFlags {
        slabs: &slabs,
        ids_l: RowLayout::dense(64, 4).unwrap(),
        flags: &flags,
        n: 64,
        out_idx: &mut oi,
        count: &mut oc,
    };
    out.push(launch.spec(&dev).unwrap());
    out
}

/// The specs of the KV-cache kernels over caches of `T` (`x`: 64 floats).
fn kv_specs<T: KvElem>(
    dev: &HostBackend,
    x: &HostBuf<f32>,
    out: &mut HostBuf<f32>,
) -> [LaunchSpec; 3] {
    let (mut ck, mut cv) = (dev.zeros::<T>(256).unwrap(), dev.zeros::<T>(256).unwrap());
    let mut part = dev.zeros::<f32>(2 * 3 * 34).unwrap();
    let launch = KvStore {
        k: x,
        v: x,
        kv_dim: 64,
        pos: 1,
        caches: T::caches_mut::<HostBackend>(&mut ck, &mut cv),
    };
    let store = launch.spec(dev).unwrap();
    let launch = AttentionDecode {
        q: x,
        caches: T::caches::<HostBackend>(&ck, &cv),
        first: 1,
        n_pos: 2,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 32,
        scale: 0.2,
        softcap: 30.0,
        sinks: Some(x),
        chunk: 64,
        part: &mut part,
        out,
    };
    let att = launch.spec(dev).unwrap();
    let launch = AttentionMerge {
        part: &part,
        n_heads: 2,
        head_dim: 32,
        n_chunks: 3,
        sinks: Some(x),
        out,
    };
    [store, att, launch.spec(dev).unwrap()]
}

#[test]
fn every_launch_spec_packs_its_kernels_parameters_with_their_widths() {
    if !find_nvrtc() {
        return;
    }
    let mut params = HashMap::new();
    for src in ops::SOURCES {
        params.extend(ptx_params(&ptx(&src, 80)));
    }
    let specs = every_spec();
    let mut launched = std::collections::HashSet::new();
    for spec in &specs {
        let Some(want) = params.get(&spec.entry) else {
            panic!("a launch of {}, which no module exports", spec.entry);
        };
        assert_eq!(
            &spec.args.sizes(),
            want,
            "{}: argument widths against the PTX's parameters",
            spec.entry
        );
        assert!(
            spec.module.entries().contains(&spec.entry),
            "{}",
            spec.entry
        );
        launched.insert(spec.entry.clone());
    }
    let unlaunched: Vec<_> = params.keys().filter(|e| !launched.contains(*e)).collect();
    assert!(
        unlaunched.is_empty(),
        "entries no spec covers: {unlaunched:?}"
    );
}

#[test]
fn rope_takes_its_angles_by_value_as_the_launch_passes_them() {
    if !find_nvrtc() {
        return;
    }
    let ptx = ptx(&ops::norm_rope::launch::SOURCE, 80);
    // norm_rope/launch.rs's RopeAngles: MAX_ROPE_PAIRS cosines then as many sines (f32), the
    // seventh argument.
    let bytes = 8 * powerinfer_cuda::MAX_ROPE_PAIRS;
    let want = format!(".param .align 4 .b8 rope_param_6[{bytes}]");
    assert!(ptx.contains(&want), "no {want:?} in the PTX of rope");
}

#[test]
fn the_ptx_parameter_reader_sees_each_width() {
    let ptx = ".entry k(\n .param .u64 k_param_0,\n .param .align 8 .b8 k_param_1[24],\n \
               .param .u32 k_param_2,\n .param .f32 k_param_3\n)\n{\n}\n.entry j()\n{\n}";
    assert_eq!(
        ptx_params(ptx),
        HashMap::from([("k".into(), vec![8, 24, 4, 4]), ("j".into(), vec![])])
    );
}

#[test]
fn cubins_for_the_exact_architecture_cached_on_disk() {
    if !find_nvrtc() {
        return;
    }
    let archs = nvrtc::supported_archs().unwrap();
    println!("NVRTC compiles binaries for {archs:?}");
    for arch in [80, 90] {
        assert!(archs.contains(&arch), "sm_{arch} missing from {archs:?}");
        let src = ops::elementwise::launch::SOURCE;
        let cubin = nvrtc::compile_cubin(src.name, &src.program(), arch).unwrap();
        assert!(cubin.starts_with(b"\x7fELF"), "sm_{arch}: not an ELF image");
    }
    // Through the cache: compiled once, then read back identical.
    let dir = std::env::temp_dir().join(format!("powerinfer-kcache-{}", std::process::id()));
    std::env::set_var(nvrtc::PTX_CACHE_DIR, &dir);
    let src = ops::norm_rope::launch::SOURCE;
    let first = nvrtc::compile_cached(src.name, &src.program(), 90).unwrap();
    assert!(
        matches!(first, nvrtc::Image::Cubin { arch: 90, .. }),
        "{}",
        first.describe()
    );
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(files.len(), 1);
    assert!(files[0].file_name().to_string_lossy().ends_with(".cubin"));
    assert_eq!(
        nvrtc::compile_cached(src.name, &src.program(), 90).unwrap(),
        first
    );
    // A GPU newer than every architecture NVRTC knows gets PTX for the newest it knows.
    let newest = *archs.last().unwrap();
    let ptx = nvrtc::compile_cached(src.name, &src.program(), newest + 1).unwrap();
    assert!(matches!(ptx, nvrtc::Image::Ptx { arch, .. } if arch == newest));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kernels_and_launches_agree_on_their_shared_constants() {
    for (define, text, file) in [
        (
            format!("#define MAX_X_BYTES {}\n", powerinfer_cuda::MAX_X_BYTES),
            ops::rows::launch::SOURCE.source,
            "sparse_matvec.cu",
        ),
        (
            format!("#define XQ_BLOCK {}\n", powerinfer_cuda::XQ_BLOCK),
            kernels::COMMON,
            "common.cuh",
        ),
        (
            format!("#define SPLIT_ROWS {}\n", powerinfer_cuda::SPLIT_ROWS),
            ops::axpy::launch::SOURCE.source,
            "axpy_down.cu",
        ),
    ] {
        assert!(
            text.contains(&define),
            "{file} must say `{}`, as layout.rs does",
            define.trim()
        );
    }
}
