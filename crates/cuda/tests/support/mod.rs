//! What the NVRTC tests share: finding libnvrtc and the NVIDIA tools of PyPI's wheels.

use std::path::PathBuf;

use powerinfer_cuda::{kernels, nvrtc};

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

/// `f` over every item of `items` on as many threads as the machine has cores, the results in
/// the items' order. NVRTC compiles are independent and its API is thread-safe; run one after
/// another they took most of these tests' time (139 s for the static check on 2 cores).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new(items.iter().map(|_| None).collect());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads.min(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                out.lock().unwrap()[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect()
}

/// Every kernel module paired with every architecture of `archs`, architecture by
/// architecture: the compile jobs of the NVRTC tests.
pub fn module_jobs(archs: &[u32]) -> Vec<(u32, &'static kernels::KernelSource)> {
    archs
        .iter()
        .flat_map(|&arch| {
            powerinfer_cuda::ops::SOURCES
                .iter()
                .map(move |src| (arch, src))
        })
        .collect()
}
