//! What the NVRTC tests share: finding libnvrtc and the NVIDIA tools of PyPI's wheels.

use std::path::PathBuf;

use powerinfer_cuda::nvrtc;

/// A path under the first directory of python3's package `module` (an NVIDIA wheel's
/// namespace package), if it exists.
pub fn wheel_path(module: &str, rel: &str) -> Option<PathBuf> {
    let code =
        format!("import {module} as m, os; print(os.path.join(list(m.__path__)[0], {rel:?}))");
    let out = std::process::Command::new(std::env::var("PYTHON").unwrap_or("python3".into()))
        .args(["-c", &code])
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    (out.status.success() && path.exists()).then_some(path)
}

/// Load libnvrtc if it can be found (`NVRTC_LIB_DIR`, else the `nvidia-cuda-nvrtc-cu12` wheel
/// python3 has, else the system); false (after printing why) when not.
pub fn find_nvrtc() -> bool {
    let wheel = std::env::var_os(nvrtc::NVRTC_LIB_DIR)
        .is_none()
        .then(|| wheel_path("nvidia.cuda_nvrtc", "lib"))
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
