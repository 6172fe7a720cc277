//! Every kernel source compiles through NVRTC to PTX for the architectures we ship for, and the
//! PTX exports every kernel the launch code names. Needs libnvrtc (CUDA 12 or 13) but no GPU:
//! found through `NVRTC_LIB_DIR`, the PyPI wheel `nvidia-cuda-nvrtc-cu12` (asked of `python3`),
//! or the system search path; skipped with a printed reason when none is found.

#![cfg(feature = "cuda")]

use std::collections::HashMap;
use std::path::PathBuf;

use powerinfer_cuda::{kernels, nvrtc};

/// Architectures compiled in CI (Ampere and Hopper; sm_75 Turing as the oldest we name).
const ARCHS: [u32; 3] = [75, 80, 90];

/// The lib directory of the `nvidia-cuda-nvrtc-cu12` wheel, if python3 has it installed.
fn wheel_lib_dir() -> Option<PathBuf> {
    let out = std::process::Command::new(std::env::var("PYTHON").unwrap_or("python3".into()))
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))",
        ])
        .output()
        .ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && dir.is_dir()).then_some(dir)
}

/// Load libnvrtc if it can be found (`NVRTC_LIB_DIR`, else the wheel python3 has, else the
/// system); false (after printing why) when not.
fn find_nvrtc() -> bool {
    let wheel = std::env::var_os(nvrtc::NVRTC_LIB_DIR)
        .is_none()
        .then(wheel_lib_dir)
        .flatten();
    if nvrtc::init(wheel.as_deref()) {
        println!("NVRTC from {}", nvrtc::loaded_library().unwrap_or_default());
        return true;
    }
    println!(
        "skipped: no libnvrtc (pip install nvidia-cuda-nvrtc-cu12, or set {} to its lib dir)",
        nvrtc::NVRTC_LIB_DIR
    );
    false
}

#[test]
fn compile_all_kernels_to_ptx() {
    if !find_nvrtc() {
        return;
    }
    let (major, minor) = nvrtc::nvrtc_version().unwrap();
    println!("NVRTC {major}.{minor}");
    let mut checked = 0;
    for arch in ARCHS {
        for src in kernels::ALL {
            let ptx =
                nvrtc::compile(src.name, &src.program(), arch).unwrap_or_else(|e| panic!("{e}"));
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
                checked += 1;
            }
        }
    }
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

/// The parameter count of every `.entry` in `ptx`.
fn ptx_param_counts(ptx: &str) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for chunk in ptx.split(".entry ").skip(1) {
        let name = chunk.split('(').next().unwrap_or("").trim().to_string();
        let params = chunk.split(')').next().unwrap_or("");
        out.insert(name, params.matches(".param ").count());
    }
    out
}

/// Each launch in `cuda_launch.rs`: the kernel it names (an entry, or a `prefix_` whose per-dtype
/// entries it launches) and how many arguments it pushes between `launch_builder` and `launch`.
fn launches(source: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut entry_prefix = None;
    let mut kernel: Option<String> = None;
    let mut pushed: Option<usize> = None;
    for line in source.lines() {
        if let Some(rest) = line.split("format!(\"").nth(1) {
            entry_prefix = rest.split("{}").next().map(str::to_string);
        }
        if let Some(rest) = line.split("self.function(&kernels::").nth(1) {
            let named = rest.split('"').nth(1).map(str::to_string);
            kernel = named.or_else(|| entry_prefix.clone());
        }
        if line.contains("launch_builder(") {
            pushed = Some(0);
        }
        if let Some(n) = pushed.as_mut() {
            *n += line.matches(".arg(").count() + line.matches("arg_opt!(").count();
        }
        if line.contains("b.launch(") {
            let k = kernel
                .take()
                .expect("a launch without self.function before it");
            out.push((k, pushed.take().expect("a launch without launch_builder")));
        }
    }
    out
}

#[test]
fn every_launch_pushes_its_kernels_parameters() {
    if !find_nvrtc() {
        return;
    }
    let mut params = HashMap::new();
    for src in kernels::ALL {
        let ptx = nvrtc::compile(src.name, &src.program(), 80).unwrap_or_else(|e| panic!("{e}"));
        params.extend(ptx_param_counts(&ptx));
    }
    let launches = launches(include_str!("../src/cuda_launch.rs"));
    assert!(
        launches.len() >= 13,
        "found only {} launches",
        launches.len()
    );
    let mut launched = std::collections::HashSet::new();
    for (kernel, pushed) in &launches {
        let entries: Vec<_> = params
            .iter()
            .filter(|(e, _)| *e == kernel || (kernel.ends_with('_') && e.starts_with(kernel)))
            .collect();
        assert!(
            !entries.is_empty(),
            "cuda_launch.rs launches {kernel}, which no module exports"
        );
        for (entry, &n) in entries {
            assert_eq!(
                *pushed, n,
                "cuda_launch.rs pushes {pushed} arguments to {entry}, whose PTX takes {n}"
            );
            launched.insert(entry.clone());
        }
    }
    let unlaunched: Vec<_> = params.keys().filter(|e| !launched.contains(*e)).collect();
    assert!(
        unlaunched.is_empty(),
        "entries no launch covers: {unlaunched:?}"
    );
}

#[test]
fn rope_takes_its_angles_by_value_as_the_launch_passes_them() {
    if !find_nvrtc() {
        return;
    }
    let src = kernels::NORM_ROPE;
    let ptx = nvrtc::compile(src.name, &src.program(), 80).unwrap_or_else(|e| panic!("{e}"));
    // cuda_launch.rs's RopeFreqs: MAX_ROPE_PAIRS f64s, 8-byte aligned, the sixth argument.
    let bytes = 8 * powerinfer_cuda::ops::MAX_ROPE_PAIRS;
    let want = format!(".param .align 8 .b8 rope_param_5[{bytes}]");
    assert!(ptx.contains(&want), "no {want:?} in the PTX of rope");
}

#[test]
fn the_launch_scanner_sees_a_missing_argument() {
    let src = r#"
        let f = self.function(&kernels::PREDICTOR, "split_hot_flags")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&a).arg(&l)
            .arg(&n);
        arg_opt!(b, flags);
        unsafe { b.launch(cfg(1, 1, 0)) }
        let entry = format!("sparse_matvec_{}", dtype_suffix(w.dtype));
        let f = self.function(&kernels::SPARSE_MATVEC, &entry)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&x);
        unsafe { b.launch(c) }
    "#;
    assert_eq!(
        launches(src),
        [
            ("split_hot_flags".to_string(), 4),
            ("sparse_matvec_".to_string(), 1)
        ]
    );
    let ptx = ".entry k(\n .param .u64 k_param_0,\n .param .align 8 .b8 k_param_1[24]\n)\n{\n}\n.entry j()\n{\n}";
    assert_eq!(
        ptx_param_counts(ptx),
        HashMap::from([("k".into(), 2), ("j".into(), 0)])
    );
}

#[test]
fn kernels_and_launches_agree_on_the_shared_memory_limit() {
    let define = format!("#define MAX_X_COLS {}", powerinfer_cuda::MAX_X_COLS);
    assert!(
        kernels::SPARSE_MATVEC.source.contains(&define),
        "sparse_matvec.cu must say `{define}`, as layout.rs does"
    );
}
