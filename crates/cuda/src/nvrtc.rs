//! NVRTC: finding and loading libnvrtc (CUDA 12 or 13), compiling a kernel source for one GPU,
//! and the disk cache of compiled kernels.
//!
//! [`compile_image`] builds a binary for the device's exact architecture (`sm_XX`, a cubin)
//! whenever this NVRTC knows it (`nvrtcGetSupportedArchs`), so the driver loads it without
//! reading PTX: PTX from NVRTC 12.9 is ISA 8.8, which drivers older than R575 refuse, and NVRTC
//! 13's needs R580. For a GPU newer than every architecture NVRTC knows, it falls back to PTX
//! for the newest one it knows, which the driver compiles. Images are cached on disk
//! (`~/.cache/powerinfer_rs/kernels/<name>-<hash>.cubin` or `.ptx`), the hash covering the
//! program text, the architecture, the kind of image and the NVRTC version, so a new source or
//! compiler never reuses a stale one.
//!
//! libnvrtc is opened at run time by our own small loader (`libloading`), which binds only the
//! nine functions we call. It tries, in order ([`candidates`]): the directory in
//! `NVRTC_LIB_DIR` (`libnvrtc.so.13`, `.so.12`, `.so`), the bare sonames on the system search
//! path (`LD_LIBRARY_PATH`, ldconfig), then the CUDA toolkit directories. Point `NVRTC_LIB_DIR`
//! at the PyPI wheel `nvidia-cuda-nvrtc-cu12` (or `-cu13`) (`site-packages/nvidia/cuda_nvrtc/lib`)
//! to compile without a toolkit. The first library that loads and exports every function wins,
//! for the whole process ([`loaded_library`] names it).

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use powerinfer_core::{Error, Result};

/// Environment variable naming a directory that holds `libnvrtc.so.13` or `libnvrtc.so.12`.
pub const NVRTC_LIB_DIR: &str = "NVRTC_LIB_DIR";
/// Environment variable overriding the kernel cache directory (`0` or empty: no disk cache).
pub const PTX_CACHE_DIR: &str = "POWERINFER_PTX_CACHE";

/// File names tried in a directory, newest CUDA first.
const NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
/// CUDA toolkit library directories tried after the system search path.
const TOOLKIT_DIRS: [&str; 2] = [
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/x86_64-linux/lib",
];

/// Every library the loader tries, in order: `dir`'s `libnvrtc.so.13`, `.so.12`, `.so` (when
/// given), the bare sonames (resolved by the dynamic linker's search path), then the same names
/// in the CUDA toolkit directories. Pure: nothing is checked on disk.
pub fn candidates(dir: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(d) = dir {
        out.extend(NAMES.iter().map(|n| d.join(n)));
    }
    out.extend(NAMES.iter().map(PathBuf::from));
    for d in TOOLKIT_DIRS {
        out.extend(NAMES.iter().map(|n| Path::new(d).join(n)));
    }
    out
}

/// `nvrtcResult` (an enum of C `int`); 0 is `NVRTC_SUCCESS`.
type NvrtcResult = c_int;
/// `nvrtcProgram`: an opaque handle.
type Program = *mut std::ffi::c_void;

/// The bound functions of one loaded libnvrtc (kept loaded for the whole process).
struct Nvrtc {
    path: String,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    get_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    /// Owns the mapping the function pointers above point into; never dropped (static).
    _lib: libloading::Library,
}

impl Nvrtc {
    /// Open `path` and bind every function; None when it does not load or lacks one.
    fn open(path: &Path) -> Option<Nvrtc> {
        if path.is_absolute() && !path.exists() {
            return None;
        }
        // SAFETY: loading libnvrtc runs its initialisers, which have no preconditions; the
        // library is kept (in the process-wide static) for as long as its functions are used.
        let lib = unsafe { libloading::Library::new(path) }.ok()?;
        macro_rules! bind {
            ($name:literal) => {
                // SAFETY: the symbol is the NVRTC C API function of that name, whose C signature
                // (nvrtc.h, unchanged from CUDA 12 to 13) is the field's type; the pointer is
                // copied out and used only while `lib` (moved into the same struct) is alive.
                unsafe { symbol(&lib, concat!($name, "\0").as_bytes()) }?
            };
        }
        Some(Nvrtc {
            path: path.display().to_string(),
            version: bind!("nvrtcVersion"),
            create_program: bind!("nvrtcCreateProgram"),
            compile_program: bind!("nvrtcCompileProgram"),
            get_ptx_size: bind!("nvrtcGetPTXSize"),
            get_ptx: bind!("nvrtcGetPTX"),
            get_cubin_size: bind!("nvrtcGetCUBINSize"),
            get_cubin: bind!("nvrtcGetCUBIN"),
            num_supported_archs: bind!("nvrtcGetNumSupportedArchs"),
            supported_archs: bind!("nvrtcGetSupportedArchs"),
            get_log_size: bind!("nvrtcGetProgramLogSize"),
            get_log: bind!("nvrtcGetProgramLog"),
            destroy_program: bind!("nvrtcDestroyProgram"),
            error_string: bind!("nvrtcGetErrorString"),
            _lib: lib,
        })
    }

    /// `Ok` for NVRTC_SUCCESS, else `Error::Cuda` naming the call and NVRTC's message.
    fn check(&self, r: NvrtcResult, what: &str) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: nvrtcGetErrorString accepts any value and returns a static C string (or
        // null, handled).
        let msg = unsafe {
            let p = (self.error_string)(r);
            if p.is_null() {
                format!("NVRTC error {r}")
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Err(Error::Cuda(format!("{what}: {msg}")))
    }
}

/// The function `name` (NUL-terminated) of `lib` as a `T`.
///
/// # Safety
/// `T` must be the function's true type, and the value used only while `lib` is loaded.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
    // SAFETY: forwarded to the caller (the symbol's type and lifetime).
    unsafe { lib.get::<T>(name) }.ok().map(|s| *s)
}

static NVRTC: OnceLock<Option<Nvrtc>> = OnceLock::new();

/// Load libnvrtc once for the process, trying `dir` (else `$NVRTC_LIB_DIR`) before the system
/// paths; later calls return the first call's outcome whatever their `dir`. True when loaded.
pub fn init(dir: Option<&Path>) -> bool {
    library().is_some() || {
        let env = std::env::var_os(NVRTC_LIB_DIR).map(PathBuf::from);
        let dir = dir.map(Path::to_path_buf).or(env);
        NVRTC
            .get_or_init(|| {
                candidates(dir.as_deref())
                    .iter()
                    .find_map(|p| Nvrtc::open(p))
            })
            .is_some()
    }
}

fn library() -> Option<&'static Nvrtc> {
    NVRTC.get().and_then(Option::as_ref)
}

/// Whether libnvrtc can be loaded (after trying [`NVRTC_LIB_DIR`]). Never panics.
pub fn nvrtc_available() -> bool {
    init(None)
}

/// The file the loader opened (a path, or a bare soname the dynamic linker resolved); None
/// when no libnvrtc loaded.
pub fn loaded_library() -> Option<String> {
    if !nvrtc_available() {
        return None;
    }
    library().map(|l| l.path.clone())
}

fn require_nvrtc() -> Result<&'static Nvrtc> {
    if nvrtc_available() {
        if let Some(l) = library() {
            return Ok(l);
        }
    }
    Err(Error::Cuda(format!(
        "libnvrtc (CUDA 12 or 13) not found: install a CUDA 12 or 13 toolkit, or `pip install \
         nvidia-cuda-nvrtc-cu12` (or -cu13) and set {NVRTC_LIB_DIR} to its nvidia/cuda_nvrtc/lib \
         directory"
    )))
}

/// The NVRTC version (major, minor); an error when libnvrtc is missing.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    let l = require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for the call.
    let r = unsafe { (l.version)(&mut major, &mut minor) };
    l.check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

/// A created program, destroyed on drop.
struct ProgramGuard<'a> {
    lib: &'a Nvrtc,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by nvrtcCreateProgram and is destroyed once, here.
        unsafe { (self.lib.destroy_program)(&mut self.prog) };
    }
}

impl ProgramGuard<'_> {
    /// Read a size-then-bytes result (the PTX, the cubin or the log).
    fn bytes(
        &self,
        size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        get: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
        what: &str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: `prog` is a live program and `n` a valid out-pointer.
        self.lib.check(unsafe { size(self.prog, &mut n) }, what)?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes NVRTC said it will write.
        self.lib
            .check(unsafe { get(self.prog, buf.as_mut_ptr().cast()) }, what)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// [`ProgramGuard::bytes`] of a NUL-terminated text (the PTX or the log).
    fn text(
        &self,
        size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        get: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
        what: &str,
    ) -> Result<String> {
        let mut buf = self.bytes(size, get, what)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// The real architectures (`sm_XX` as XX) this NVRTC compiles binaries for, ascending.
pub fn supported_archs() -> Result<Vec<u32>> {
    let l = require_nvrtc()?;
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    l.check(
        unsafe { (l.num_supported_archs)(&mut n) },
        "nvrtcGetNumSupportedArchs",
    )?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    // SAFETY: `archs` holds the `n` ints NVRTC said it will write.
    l.check(
        unsafe { (l.supported_archs)(archs.as_mut_ptr()) },
        "nvrtcGetSupportedArchs",
    )?;
    let mut out: Vec<u32> = archs.into_iter().map(|a| a.max(0) as u32).collect();
    out.sort_unstable();
    Ok(out)
}

/// A compiled module: a binary for one architecture, or PTX the driver compiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// An ELF cubin for `sm_<arch>`.
    Cubin { arch: u32, data: Vec<u8> },
    /// PTX for `compute_<arch>`.
    Ptx { arch: u32, text: String },
}

impl Image {
    /// "sm_90 cubin" or "compute_90 PTX", for messages.
    pub fn describe(&self) -> String {
        match self {
            Image::Cubin { arch, .. } => format!("sm_{arch} cubin"),
            Image::Ptx { arch, .. } => format!("compute_{arch} PTX"),
        }
    }
}

/// What [`compile_image`] builds for a device of `arch` when NVRTC supports `supported`: a cubin
/// for `arch` itself when listed, else PTX for the newest listed architecture below it (the
/// driver compiles that for the device); None when NVRTC knows nothing that old.
pub fn image_kind(arch: u32, supported: &[u32]) -> Option<(bool, u32)> {
    if supported.contains(&arch) {
        return Some((true, arch));
    }
    supported
        .iter()
        .copied()
        .filter(|&a| a <= arch)
        .max()
        .map(|a| (false, a))
}

/// Compile `program` to PTX for `compute_<arch>` (e.g. 80, 90). `name` labels errors; a
/// compile error carries NVRTC's log.
pub fn compile(name: &str, program: &str, arch: u32) -> Result<String> {
    let lib = require_nvrtc()?;
    let guard = build(lib, name, program, &format!("compute_{arch}"), &[])?;
    guard.text(lib.get_ptx_size, lib.get_ptx, "nvrtcGetPTX")
}

/// Compile `program` to a cubin for `sm_<arch>` (an ELF image the driver loads as it is).
pub fn compile_cubin(name: &str, program: &str, arch: u32) -> Result<Vec<u8>> {
    let lib = require_nvrtc()?;
    let guard = build(lib, name, program, &format!("sm_{arch}"), &[])?;
    guard.bytes(lib.get_cubin_size, lib.get_cubin, "nvrtcGetCUBIN")
}

/// [`compile_cubin`] with ptxas's report: the cubin and NVRTC's log, which holds, per kernel,
/// ptxas's "Used N registers", shared memory, stack frame and spill lines (the static check of
/// the kernels, `tests/static_check.rs`, reads them).
pub fn compile_cubin_verbose(name: &str, program: &str, arch: u32) -> Result<(Vec<u8>, String)> {
    let lib = require_nvrtc()?;
    let guard = build(
        lib,
        name,
        program,
        &format!("sm_{arch}"),
        &["--ptxas-options=-v"],
    )?;
    let cubin = guard.bytes(lib.get_cubin_size, lib.get_cubin, "nvrtcGetCUBIN")?;
    let log = guard.text(lib.get_log_size, lib.get_log, "nvrtcGetProgramLog")?;
    Ok((cubin, log))
}

/// The image for a device of compute capability `arch`: see [`image_kind`].
pub fn compile_image(name: &str, program: &str, arch: u32) -> Result<Image> {
    let supported = supported_archs()?;
    match image_kind(arch, &supported) {
        Some((true, a)) => Ok(Image::Cubin {
            arch: a,
            data: compile_cubin(name, program, a)?,
        }),
        Some((false, a)) => Ok(Image::Ptx {
            arch: a,
            text: compile(name, program, a)?,
        }),
        None => Err(Error::Cuda(format!(
            "sm_{arch}: this NVRTC compiles for {supported:?} only (the GPU is too old for it)"
        ))),
    }
}

/// A compiled program for `--gpu-architecture=<target>`, with `extra` options.
fn build<'a>(
    lib: &'a Nvrtc,
    name: &str,
    program: &str,
    target: &str,
    extra: &[&str],
) -> Result<ProgramGuard<'a>> {
    let nul = |s: String| CString::new(s).map_err(|_| Error::Cuda(format!("{name}: NUL in text")));
    let src = nul(program.to_string())?;
    let file = nul(format!("{name}.cu"))?;
    let mut opts = vec![
        nul(format!("--gpu-architecture={target}"))?,
        nul("--std=c++17".into())?,
    ];
    for o in extra {
        opts.push(nul(o.to_string())?);
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: `src` and `file` are NUL-terminated and outlive the call; no headers are passed
    // (count 0, null arrays); `prog` is a valid out-pointer.
    let r = unsafe {
        (lib.create_program)(
            &mut prog,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    lib.check(r, &format!("nvrtcCreateProgram ({name}.cu)"))?;
    let guard = ProgramGuard { lib, prog };
    // SAFETY: `prog` is live; `opt_ptrs` holds opts.len() NUL-terminated strings that outlive
    // the call.
    let r =
        unsafe { (lib.compile_program)(guard.prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if r != 0 {
        let log = guard
            .text(lib.get_log_size, lib.get_log, "nvrtcGetProgramLog")
            .unwrap_or_default();
        let status = lib.check(r, "nvrtcCompileProgram").unwrap_err();
        return Err(Error::Cuda(format!(
            "NVRTC failed to compile {name}.cu for {target} ({status}):\n{log}"
        )));
    }
    Ok(guard)
}

/// [`compile_image`] through the disk cache: reuse `<cache>/<name>-<hash>.cubin` (or `.ptx`)
/// when present and well-formed, else compile and store it (a cache that cannot be written is
/// skipped, never an error).
pub fn compile_cached(name: &str, program: &str, arch: u32) -> Result<Image> {
    let (major, minor) = nvrtc_version()?;
    let Some((cubin, target)) = image_kind(arch, &supported_archs()?) else {
        return compile_image(name, program, arch);
    };
    let key = fnv1a(&[
        program.as_bytes(),
        &target.to_le_bytes(),
        &[u8::from(cubin), major as u8, minor as u8],
    ]);
    let ext = if cubin { "cubin" } else { "ptx" };
    let path = cache_dir().map(|d| d.join(format!("{name}-{key:016x}.{ext}")));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if cubin && bytes.starts_with(b"\x7fELF") {
            return Ok(Image::Cubin {
                arch: target,
                data: bytes,
            });
        }
        if !cubin && bytes.windows(6).any(|w| w == b".entry") {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            return Ok(Image::Ptx { arch: target, text });
        }
    }
    let image = compile_image(name, program, arch)?;
    if let Some(p) = &path {
        let bytes = match &image {
            Image::Cubin { data, .. } => data.as_slice(),
            Image::Ptx { text, .. } => text.as_bytes(),
        };
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let ok = p
            .parent()
            .is_some_and(|d| std::fs::create_dir_all(d).is_ok())
            && std::fs::write(&tmp, bytes).is_ok();
        // Rename so a concurrent reader never sees a half-written file.
        if !ok || std::fs::rename(&tmp, p).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(image)
}

/// `$POWERINFER_PTX_CACHE`, else `$XDG_CACHE_HOME/powerinfer_rs/kernels`, else
/// `~/.cache/powerinfer_rs/kernels`; None when disabled or no home is known.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(PTX_CACHE_DIR) {
        return (!d.is_empty() && d != "0").then(|| PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("powerinfer_rs").join("kernels"))
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
    fn a_cubin_for_the_exact_architecture_else_ptx_for_the_newest_known_below_it() {
        let known = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(image_kind(90, &known), Some((true, 90)));
        assert_eq!(image_kind(87, &known), Some((false, 86)));
        assert_eq!(image_kind(130, &known), Some((false, 120)));
        assert_eq!(image_kind(70, &known), None);
    }

    #[test]
    fn hash_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }

    #[test]
    fn candidates_try_the_directory_then_sonames_then_the_toolkit_newest_first() {
        let got = candidates(Some(Path::new("/opt/nvrtc")));
        let want: Vec<PathBuf> = [
            "/opt/nvrtc/libnvrtc.so.13",
            "/opt/nvrtc/libnvrtc.so.12",
            "/opt/nvrtc/libnvrtc.so",
            "libnvrtc.so.13",
            "libnvrtc.so.12",
            "libnvrtc.so",
            "/usr/local/cuda/lib64/libnvrtc.so.13",
            "/usr/local/cuda/lib64/libnvrtc.so.12",
            "/usr/local/cuda/lib64/libnvrtc.so",
            "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13",
            "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.12",
            "/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
        // Without a directory: the sonames first.
        assert_eq!(candidates(None), want[3..]);
    }
}
