//! The static check of every GPU kernel, with no GPU. Each module is compiled by NVRTC to a
//! cubin for sm_80, sm_89 and sm_90 (with ptxas's report) and to PTX; the cubin is
//! disassembled by nvdisasm (PyPI's `nvidia-cuda-nvdisasm`). Per kernel and architecture:
//! - **launch bounds**: `__launch_bounds__` (a `.maxntid` in its PTX), and ptxas's registers
//!   times those threads within an SM's 64 Ki registers;
//! - **no local memory**: no stack frame, no spill stores or loads, no LDL/STL in its SASS;
//! - **no integer division in its loops**: no PTX `div`/`rem` on integers between a label and
//!   a branch back to it;
//! - **16-byte loads**: `LDG.E.128` in the kernels that stream weights or the KV cache.
//!
//! It prints a table: registers, shared memory, stack and spills, the global loads by width.
//! A criterion a kernel does not meet yet is listed in [`PENDING`] with the reason; an entry
//! there that the kernel now meets fails the test, so the list only shrinks.
//!
//! Needs libnvrtc and nvdisasm (the wheels python3 has, or `NVRTC_LIB_DIR` / `NVDISASM`);
//! skipped with a printed reason without them, unless `POWERINFER_RS_REQUIRE_STATIC_CHECK` is
//! set, as CI sets it.

#![cfg(feature = "cuda")]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use powerinfer_cuda::{kernels, nvrtc};

/// Ampere (A100), Ada (RTX 4090) and Hopper (H100).
const ARCHS: [u32; 3] = [80, 89, 90];
/// Registers of one SM on every architecture of [`ARCHS`].
const REGISTERS_PER_SM: u32 = 65_536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Criterion {
    LaunchBounds,
    NoLocalMemory,
    NoLoopDivision,
    VectorLoads,
}
use Criterion::*;

/// Kernels (by name prefix) that stream weights or the KV cache: their loads must be 16 bytes.
const STREAMING: [&str; 5] = [
    "sparse_matvec_",
    "gate_up_",
    "axpy_rows_",
    "predictor_fc2_",
    "attention_decode",
];

/// What a kernel (by name prefix) does not meet yet, and why.
const PENDING: &[(&str, Criterion, &str)] = &[];

/// What the compilers say of one kernel on one architecture.
#[derive(Clone, Debug, Default)]
struct Facts {
    regs: u32,
    smem: u32,
    stack: u32,
    spills: u32,
    max_threads: Option<u32>,
    ldg128: u32,
    ldg64: u32,
    ldg_narrow: u32,
    local: u32,
    loop_divisions: u32,
}

impl Facts {
    /// Whether the kernel `name` meets `c`.
    fn meets(&self, name: &str, c: Criterion) -> bool {
        match c {
            LaunchBounds => self
                .max_threads
                .is_some_and(|t| self.regs * t <= REGISTERS_PER_SM),
            NoLocalMemory => self.stack == 0 && self.spills == 0 && self.local == 0,
            NoLoopDivision => self.loop_divisions == 0,
            VectorLoads => !streams(name) || self.ldg128 > 0,
        }
    }
}

fn streams(name: &str) -> bool {
    STREAMING.iter().any(|p| name.starts_with(p))
}

fn pending(name: &str, c: Criterion) -> Option<&'static str> {
    PENDING
        .iter()
        .find(|(p, pc, _)| name.starts_with(p) && *pc == c)
        .map(|(_, _, why)| *why)
}

/// The numbers after which `label` follows on `line` ("0 bytes stack frame" -> 0).
fn number_before(line: &str, label: &str) -> Option<u32> {
    let head = &line[..line.find(label)?];
    head.split(|c: char| !c.is_ascii_digit())
        .rfind(|t| !t.is_empty())?
        .parse()
        .ok()
}

/// ptxas's report in NVRTC's log, per kernel.
fn read_ptxas(log: &str, facts: &mut BTreeMap<String, Facts>) {
    let mut current = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().unwrap_or("").to_string();
            continue;
        }
        let f = facts.entry(current.clone()).or_default();
        if line.contains("bytes stack frame") {
            f.stack = number_before(line, "bytes stack frame").unwrap_or(0);
            f.spills = number_before(line, "bytes spill stores").unwrap_or(0)
                + number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("registers") {
            f.regs = number_before(line, "registers").unwrap_or(0);
            f.smem = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
}

/// Per kernel of `ptx`: its `.maxntid`, and the integer divisions inside loops (between a
/// label and a later branch back to it).
fn read_ptx(ptx: &str, facts: &mut BTreeMap<String, Facts>) {
    for chunk in ptx.split(".entry ").skip(1) {
        let name = chunk.split('(').next().unwrap_or("").trim().to_string();
        let f = facts.entry(name).or_default();
        let head = chunk.split('{').next().unwrap_or("");
        // ".maxntid 256, 1, 1": the block's threads are the product.
        f.max_threads = head.lines().find_map(|l| {
            let dims = l.trim().strip_prefix(".maxntid")?;
            dims.split(',')
                .map(|d| d.trim().parse::<u32>().ok())
                .product()
        });
        let lines: Vec<&str> = chunk.lines().map(str::trim).collect();
        let mut labels = BTreeMap::new();
        let mut in_loop = vec![false; lines.len()];
        for (i, l) in lines.iter().enumerate() {
            if let Some(label) = l.strip_suffix(':') {
                labels.insert(label.to_string(), i);
            }
            if let Some(target) = l.split("bra").nth(1).filter(|_| l.contains("bra")) {
                let target = target
                    .trim_start_matches(".uni")
                    .trim()
                    .trim_end_matches(';');
                if let Some(&start) = labels.get(target) {
                    in_loop[start..=i].iter_mut().for_each(|b| *b = true);
                }
            }
        }
        let division = |l: &str| {
            ["div.s", "div.u", "rem.s", "rem.u"]
                .iter()
                .any(|op| l.starts_with(op) || l.contains(&format!(" {op}")))
        };
        f.loop_divisions = lines
            .iter()
            .zip(&in_loop)
            .filter(|(l, inside)| **inside && division(l))
            .count() as u32;
    }
}

/// Per kernel of nvdisasm's listing: global loads by width and local-memory accesses.
fn read_sass(sass: &str, facts: &mut BTreeMap<String, Facts>) {
    for chunk in sass.split("\t.section\t.text.").skip(1) {
        let name = chunk.split(',').next().unwrap_or("").to_string();
        let f = facts.entry(name).or_default();
        for l in chunk.lines() {
            let Some(op) = l.split(';').next().and_then(|i| {
                i.split_whitespace()
                    .find(|t| t.starts_with("LDG") || t.starts_with("LDL") || t.starts_with("STL"))
            }) else {
                continue;
            };
            if op.starts_with("LDL") || op.starts_with("STL") {
                f.local += 1;
            } else if op.contains(".128") {
                f.ldg128 += 1;
            } else if op.contains(".64") {
                f.ldg64 += 1;
            } else {
                f.ldg_narrow += 1;
            }
        }
    }
}

/// nvdisasm: `NVDISASM`, else the `nvidia-cuda-nvdisasm` wheel python3 has.
fn find_nvdisasm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVDISASM") {
        return Some(PathBuf::from(p));
    }
    ["nvidia.cu13", "nvidia.cuda_nvdisasm"]
        .iter()
        .find_map(|m| support::wheel_path(m, "bin/nvdisasm"))
}

/// What the compilers say of one module on one architecture: ptxas's log, the PTX and the
/// disassembled cubin.
struct Outputs {
    log: String,
    ptx: String,
    sass: String,
}

/// Compile `src` for `arch` (cubin with ptxas's report, and PTX) and disassemble the cubin.
fn compile(src: &kernels::KernelSource, arch: u32, nvdisasm: &PathBuf, dir: &Path) -> Outputs {
    let program = src.program();
    let (cubin, log) =
        nvrtc::compile_cubin_verbose(src.name, &program, arch).unwrap_or_else(|e| panic!("{e}"));
    let ptx = nvrtc::compile(src.name, &program, arch).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.join(format!("{}-sm_{arch}.cubin", src.name));
    std::fs::write(&path, &cubin).unwrap();
    let out = std::process::Command::new(nvdisasm)
        .arg("-c")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", nvdisasm.display()));
    assert!(
        out.status.success(),
        "nvdisasm {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let sass = String::from_utf8_lossy(&out.stdout).into_owned();
    Outputs { log, ptx, sass }
}

/// Every kernel of every module on each architecture of [`ARCHS`], in that order (the modules
/// compiled on every core: [`support::par_map`]).
fn facts_per_arch(nvdisasm: &PathBuf) -> Vec<BTreeMap<String, Facts>> {
    let dir = std::env::temp_dir().join(format!("powerinfer-static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let jobs = support::module_jobs(&ARCHS);
    let outputs = support::par_map(&jobs, |&(arch, src)| compile(src, arch, nvdisasm, &dir));
    let mut all = Vec::new();
    for arch in ARCHS {
        let mut facts = BTreeMap::new();
        for (&(a, src), out) in jobs.iter().zip(&outputs) {
            if a != arch {
                continue;
            }
            read_ptxas(&out.log, &mut facts);
            read_ptx(&out.ptx, &mut facts);
            read_sass(&out.sass, &mut facts);
            for e in src.entries() {
                assert!(facts.contains_key(&e), "sm_{arch}: no facts for {e}");
            }
        }
        facts.remove("");
        all.push(facts);
    }
    // POWERINFER_RS_KEEP_CUBINS=1 keeps them, to read the machine code (`nvdisasm -c`).
    if std::env::var_os("POWERINFER_RS_KEEP_CUBINS").is_some() {
        println!("cubins kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    all
}

#[test]
fn every_kernel_passes_the_static_check() {
    let required = std::env::var_os("POWERINFER_RS_REQUIRE_STATIC_CHECK").is_some();
    let tools = support::find_nvrtc().then(find_nvdisasm).flatten();
    let Some(nvdisasm) = tools else {
        assert!(
            !required,
            "POWERINFER_RS_REQUIRE_STATIC_CHECK is set but NVRTC or nvdisasm is missing"
        );
        println!("skipped: no nvdisasm (pip install nvidia-cuda-nvdisasm, or set NVDISASM)");
        return;
    };
    // The table, printed and, where POWERINFER_RS_STATIC_CHECK_TABLE names a file, written
    // there (`.ci/run` prints it without running the test a second time).
    let mut table = String::new();
    macro_rules! line {
        ($($arg:tt)*) => {{
            let l = format!($($arg)*);
            println!("{l}");
            table.push_str(&l);
            table.push('\n');
        }};
    }
    let mut failures = Vec::new();
    let mut still_pending: BTreeMap<(String, Criterion), bool> = BTreeMap::new();
    for (arch, facts) in ARCHS.into_iter().zip(facts_per_arch(&nvdisasm)) {
        line!(
            "\nsm_{arch}: {:<28} {:>4} {:>6} {:>5} {:>6} {:>6} {:>5} {:>6} {:>6} {:>5}",
            "kernel",
            "regs",
            "smem",
            "stack",
            "spills",
            "threads",
            "ldg16",
            "ldg8",
            "narrow",
            "ldiv"
        );
        for (name, f) in &facts {
            line!(
                "sm_{arch}: {name:<28} {:>4} {:>6} {:>5} {:>6} {:>6} {:>5} {:>6} {:>6} {:>5}",
                f.regs,
                f.smem,
                f.stack,
                f.spills,
                f.max_threads.map_or("-".into(), |t| t.to_string()),
                f.ldg128,
                f.ldg64,
                f.ldg_narrow,
                f.loop_divisions
            );
            for c in [LaunchBounds, NoLocalMemory, NoLoopDivision, VectorLoads] {
                let ok = f.meets(name, c);
                match pending(name, c) {
                    Some(_) => {
                        let key = PENDING
                            .iter()
                            .find(|(p, pc, _)| name.starts_with(p) && *pc == c)
                            .unwrap()
                            .0;
                        *still_pending.entry((key.to_string(), c)).or_default() |= !ok;
                    }
                    None if !ok => failures.push(format!("sm_{arch} {name}: fails {c:?}")),
                    None => {}
                }
            }
        }
    }
    line!("\npending (not yet met, with why):");
    for (p, c, why) in PENDING {
        line!("  {p}* {c:?}: {why}");
        match still_pending.get(&(p.to_string(), *c)) {
            Some(true) => {}
            Some(false) => failures.push(format!("{p}* now meets {c:?}: remove it from PENDING")),
            None => failures.push(format!("PENDING names {p}*, which no kernel matches")),
        }
    }
    if let Some(path) = std::env::var_os("POWERINFER_RS_STATIC_CHECK_TABLE") {
        std::fs::write(&path, &table).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
