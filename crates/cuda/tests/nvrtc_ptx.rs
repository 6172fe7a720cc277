//! Every kernel source compiles through NVRTC to PTX for the architectures we ship for, and the
//! PTX exports every kernel the launch code names. Needs libnvrtc but no GPU: found through
//! `NVRTC_LIB_DIR`, the system search path, or the PyPI wheel `nvidia-cuda-nvrtc-cu12` (asked
//! of `python3`); skipped with a printed reason when none is found.

#![cfg(feature = "cuda")]

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

/// Load libnvrtc if it can be found; false (after printing why) when not.
fn find_nvrtc() -> bool {
    if std::env::var_os(nvrtc::NVRTC_LIB_DIR).is_none() {
        if let Some(dir) = wheel_lib_dir() {
            nvrtc::preload_from(&dir);
        }
    }
    if nvrtc::nvrtc_available() {
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
