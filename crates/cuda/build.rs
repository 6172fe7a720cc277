//! With the `emu` feature, compiles the CUDA kernels of `kernels/*.cu` for the host, after the
//! emulator's header `emu/cuda_emu.h`, with the emulator's runtime (`emu/emu_runtime.cpp`), into
//! one static library (the `cc` crate, C++20). `POWERINFER_EMU_SANITIZE=address` or `thread`
//! builds them under AddressSanitizer (with UndefinedBehaviorSanitizer) or ThreadSanitizer and
//! links the sanitizer's runtime into the binaries that link them (`benchmarks/gpu/emu.sh`
//! preloads it into the test binaries). Without the feature this does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=emu");
    println!("cargo:rerun-if-env-changed=POWERINFER_EMU_SANITIZE");
    #[cfg(feature = "emu")]
    emu::build();
}

#[cfg(feature = "emu")]
mod emu {
    use std::path::{Path, PathBuf};

    /// The kernel modules: every `kernels/*.cu`, by stem, sorted.
    fn modules(dir: &Path) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(dir)
            .expect("reading crates/cuda/kernels")
            .filter_map(|e| {
                let p = e.ok()?.path();
                (p.extension()? == "cu").then(|| p.file_stem()?.to_str().map(String::from))?
            })
            .collect();
        out.sort();
        out
    }

    pub fn build() {
        let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
        let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
        let kernels = root.join("kernels");
        let mods = modules(&kernels);
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++20")
            .include(root.join("emu"))
            .include(&kernels)
            .file(root.join("emu").join("emu_runtime.cpp"))
            .flag("-fno-strict-aliasing")
            .flag_if_supported("-Wno-unknown-pragmas")
            .warnings(true);
        // One translation unit per module, as NVRTC compiles them: header, common.cuh, the
        // module's own header, the file, and an anchor the runtime calls so the linker keeps the
        // module (and the registrations of its kernels).
        let mut anchors = String::new();
        for m in &mods {
            let tu = out.join(format!("emu_{m}.cpp"));
            // The module's own header, when it has one (kernels.rs `KernelSource::header`).
            let header = match kernels.join(format!("{m}.cuh")).exists() {
                true => format!("#include \"{m}.cuh\"\n"),
                false => String::new(),
            };
            let text = format!(
                "#include \"cuda_emu.h\"\n#include \"common.cuh\"\n{header}#include \"{m}.cu\"\n\
                 extern \"C\" void powerinfer_emu_anchor_{m}(void) {{}}\n"
            );
            std::fs::write(&tu, text).unwrap();
            b.file(tu);
            anchors.push_str(&format!(
                "extern \"C\" void powerinfer_emu_anchor_{m}(void);\n"
            ));
        }
        // The emulator's own checks (kernels that break the rules on purpose).
        let selftest = out.join("emu_selftest.cpp");
        let text = "#include <chrono>\n#include <thread>\n#include \"cuda_emu.h\"\n\
                    #include \"common.cuh\"\n#include \"selftest.cu\"\n\
                    extern \"C\" void powerinfer_emu_anchor_selftest(void) {}\n";
        std::fs::write(&selftest, text).unwrap();
        b.file(selftest);
        anchors.push_str("extern \"C\" void powerinfer_emu_anchor_selftest(void);\n");
        anchors.push_str("extern \"C\" void powerinfer_emu_link_modules(void) {\n");
        anchors.push_str("    powerinfer_emu_anchor_selftest();\n");
        for m in &mods {
            anchors.push_str(&format!("    powerinfer_emu_anchor_{m}();\n"));
        }
        anchors.push_str("}\n");
        let list = out.join("emu_modules.cpp");
        std::fs::write(&list, anchors).unwrap();
        b.file(list);
        // The sanitizer's runtime is linked by name into every binary that links the kernels
        // (rustc links with -nodefaultlibs, so `-fsanitize` at link time would add none); the
        // test runner preloads it (benchmarks/gpu/emu.sh). Set here rather than in RUSTFLAGS,
        // so that switching sanitizers rebuilds this crate and its dependents, not every crate.
        let sanitizer = std::env::var("POWERINFER_EMU_SANITIZE").unwrap_or_default();
        let runtimes: &[&str] = match sanitizer.as_str() {
            "address" => {
                b.flag("-fsanitize=address,undefined")
                    .flag("-fno-sanitize-recover=undefined")
                    .flag("-fno-omit-frame-pointer")
                    .opt_level(1)
                    .debug(true);
                &["asan", "ubsan"]
            }
            "thread" => {
                b.flag("-fsanitize=thread").opt_level(1).debug(true);
                &["tsan"]
            }
            "" => {
                b.opt_level(2);
                &[]
            }
            other => panic!("POWERINFER_EMU_SANITIZE={other}: expected address or thread"),
        };
        b.compile("powerinfer_emu");
        for lib in runtimes {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        // `powerinfer_cuda::EMU_SANITIZER`: the kernel tests size their sanitized runs by it.
        println!("cargo:rustc-env=POWERINFER_EMU_SANITIZER={sanitizer}");
    }
}
