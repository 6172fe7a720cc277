//! NVRTC: finding libnvrtc, compiling a kernel source to PTX for one architecture, and the PTX
//! disk cache (`~/.cache/powerinfer_rs/ptx/<hash>.ptx`, the hash covering the program text, the
//! architecture and the NVRTC version, so a new source or compiler never reuses stale PTX).
//!
//! libnvrtc is loaded at run time. Besides the system search path (`LD_LIBRARY_PATH`, a CUDA
//! toolkit), the directory in `NVRTC_LIB_DIR` is tried first: point it at the PyPI wheel
//! `nvidia-cuda-nvrtc-cu12` (`site-packages/nvidia/cuda_nvrtc/lib`) to compile without a
//! toolkit.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use powerinfer_core::{Error, Result};

/// Environment variable naming a directory that holds `libnvrtc.so.12`.
pub const NVRTC_LIB_DIR: &str = "NVRTC_LIB_DIR";
/// Environment variable overriding the PTX cache directory (`0` or empty: no disk cache).
pub const PTX_CACHE_DIR: &str = "POWERINFER_PTX_CACHE";

/// Whether libnvrtc can be loaded (after trying [`NVRTC_LIB_DIR`]). Never panics.
pub fn nvrtc_available() -> bool {
    *AVAILABLE.get_or_init(|| {
        if let Some(dir) = std::env::var_os(NVRTC_LIB_DIR) {
            preload_from(Path::new(&dir));
        }
        // SAFETY: only tries to dlopen the candidate names and closes what it opened.
        unsafe { cudarc::nvrtc::sys::is_culib_present() }
    })
}

static AVAILABLE: OnceLock<bool> = OnceLock::new();

/// Open `dir/libnvrtc.so.12` by absolute path and keep it loaded, so cudarc's later
/// `dlopen("libnvrtc.so.12")` finds it by its soname. True when it loaded.
pub fn preload_from(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        extern "C" {
            fn dlopen(filename: *const std::ffi::c_char, flag: std::ffi::c_int) -> *mut u8;
        }
        const RTLD_NOW: std::ffi::c_int = 2;
        const RTLD_GLOBAL: std::ffi::c_int = 0x100;
        for name in ["libnvrtc.so.12", "libnvrtc.so"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
                continue;
            };
            // SAFETY: `c` is a NUL-terminated path; the handle is deliberately never closed (the
            // library stays loaded for the process, as cudarc keeps its own handle).
            let handle = unsafe { dlopen(c.as_ptr(), RTLD_NOW | RTLD_GLOBAL) };
            if !handle.is_null() {
                return true;
            }
        }
        false
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

/// The NVRTC version (major, minor); an error when libnvrtc is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: libnvrtc is loaded (checked above); both pointers are valid for the call.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    r.result()
        .map_err(|e| Error::Cuda(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

fn require_nvrtc() -> Result<()> {
    if nvrtc_available() {
        return Ok(());
    }
    Err(Error::Cuda(format!(
        "libnvrtc.so.12 not found: install a CUDA 12 toolkit or `pip install \
         nvidia-cuda-nvrtc-cu12` and set {NVRTC_LIB_DIR} to its nvidia/cuda_nvrtc/lib directory"
    )))
}

/// Compile `program` to PTX for `compute_<arch>` (e.g. 80, 90). `name` labels errors.
pub fn compile(name: &str, program: &str, arch: u32) -> Result<String> {
    require_nvrtc()?;
    let opts = CompileOptions {
        name: Some(format!("{name}.cu")),
        options: vec![
            format!("--gpu-architecture=compute_{arch}"),
            "--std=c++17".into(),
        ],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(program, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => Error::Cuda(format!(
            "NVRTC failed to compile {name}.cu for compute_{arch}:\n{}",
            log.to_string_lossy()
        )),
        other => Error::Cuda(format!("NVRTC ({name}.cu, compute_{arch}): {other:?}")),
    })?;
    Ok(ptx.to_src())
}

/// [`compile`] through the disk cache: reuse `<cache>/<hash>.ptx` when present, else compile
/// and store it (a cache that cannot be written is skipped, never an error).
pub fn compile_cached(name: &str, program: &str, arch: u32) -> Result<String> {
    let (major, minor) = nvrtc_version()?;
    let key = fnv1a(&[
        program.as_bytes(),
        &arch.to_le_bytes(),
        &[major as u8, minor as u8],
    ]);
    let path = cache_dir().map(|d| d.join(format!("{name}-{key:016x}.ptx")));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".entry") {
                return Ok(text);
            }
        }
    }
    let ptx = compile(name, program, arch)?;
    if let Some(p) = &path {
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let ok = p
            .parent()
            .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, &ptx).is_ok();
        // Rename so a concurrent reader never sees a half-written file.
        if !ok || std::fs::rename(&tmp, p).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(ptx)
}

/// `$POWERINFER_PTX_CACHE`, else `$XDG_CACHE_HOME/powerinfer_rs/ptx`, else
/// `~/.cache/powerinfer_rs/ptx`; None when disabled or no home is known.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(PTX_CACHE_DIR) {
        return (!d.is_empty() && d != "0").then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("powerinfer_rs").join("ptx"))
}

/// 64-bit FNV-1a over the parts (stable across Rust versions, unlike `DefaultHasher`).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }
}
