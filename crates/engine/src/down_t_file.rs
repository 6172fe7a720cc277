//! The transposed down projections in a file, memory-mapped: the rows the sparse modes read for
//! the neurons that fire, held by the page cache (evictable under memory pressure, shared by the
//! processes that map the same file) instead of an anonymous copy the size of every `ffn_down`.
//! For machines whose memory that copy would not fit: the memory-mapped engine then pages its
//! down rows in as it pages in the rest of the model.
//!
//! The file: a header of [`HEADER`] bytes (magic `PIRSDNT1`, `u32` version 1, `u32` layers, `u32`
//! length and UTF-8 bytes of the model's fingerprint, then per layer a `u64` byte count and a
//! `u8` index into [`DType::ALL`], zero padded), then each layer's rows, every layer starting at
//! a multiple of [`HEADER`]. Written once; a file whose header does not describe this model's
//! transposes exactly (or is cut short) is written again.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use powerinfer_core::{ensure, Buffer, DType, Error, ModelConfig, Result, Weight};

use powerinfer_cpu::Matrix;

use crate::layer_weights::LayerWeights;
use crate::transpose::{transpose_into, transposed_bytes, transposed_dtype};

/// The file's magic bytes.
const MAGIC: &[u8; 8] = b"PIRSDNT1";
/// The format version.
const VERSION: u32 = 1;
/// Bytes of the header, and the alignment of every layer's rows.
pub const HEADER: usize = 4096;
/// Longest fingerprint the header holds.
const MAX_FINGERPRINT: usize = 256;

/// `n` rounded up to a multiple of [`HEADER`].
fn aligned(n: usize) -> usize {
    n.div_ceil(HEADER) * HEADER
}

/// The header for layers of `sizes` bytes in `dtypes`.
fn header(fingerprint: &str, sizes: &[usize], dtypes: &[DType]) -> Result<Vec<u8>> {
    ensure!(
        fingerprint.len() <= MAX_FINGERPRINT,
        Shape,
        "a fingerprint of {} bytes (at most {MAX_FINGERPRINT})",
        fingerprint.len()
    );
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&VERSION.to_le_bytes());
    h.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
    h.extend_from_slice(&(fingerprint.len() as u32).to_le_bytes());
    h.extend_from_slice(fingerprint.as_bytes());
    for (&n, d) in sizes.iter().zip(dtypes) {
        h.extend_from_slice(&(n as u64).to_le_bytes());
        h.push(DType::ALL.iter().position(|x| x == d).unwrap_or(0) as u8);
    }
    ensure!(
        h.len() <= HEADER,
        Unsupported,
        "a transposed-down file for {} layers (its header holds about 400)",
        sizes.len()
    );
    h.resize(HEADER, 0);
    Ok(h)
}

/// Whether the file at `path` is `bytes` long and starts with `want`.
fn holds(path: &Path, want: &[u8], bytes: u64) -> bool {
    use std::io::Read;
    let Ok(mut f) = powerinfer_core::files::open_regular(path) else {
        return false;
    };
    let mut head = vec![0u8; want.len()];
    f.metadata().is_ok_and(|m| m.len() == bytes) && f.read_exact(&mut head).is_ok() && head == want
}

/// The transposed down projections of a model's `layers` (of config `config`) from the file at
/// `path`, memory-mapped; the file is written first (one layer in memory at a time, through a
/// `.part` file renamed at the end) unless it already holds them for `fingerprint`. Mixtures of
/// experts are refused.
pub fn map_down_t(
    config: &ModelConfig,
    layers: &[LayerWeights],
    path: &Path,
    fingerprint: &str,
) -> Result<Vec<Weight>> {
    ensure!(
        !config.moe.is_moe(),
        Unsupported,
        "a transposed-down file of a mixture of experts is not supported yet"
    );
    let io = |what: &str, e: std::io::Error| {
        Error::ModelFile(format!("{}: {what}: {e}", path.display()))
    };
    let downs: Vec<&Matrix> = layers.iter().map(|l| &l.w_down).collect();
    let sizes = downs
        .iter()
        .map(|w| transposed_bytes(*w))
        .collect::<Result<Vec<_>>>()?;
    let dtypes: Vec<DType> = downs.iter().map(|w| transposed_dtype(*w)).collect();
    let head = header(fingerprint, &sizes, &dtypes)?;
    let total = HEADER + sizes.iter().map(|&n| aligned(n)).sum::<usize>();
    // Something at `path` that is not a regular file (a FIFO, a directory) is the caller's
    // mistake, never replaced.
    powerinfer_core::files::check_writable_path(path).map_err(|e| io("writing", e))?;
    if !holds(path, &head, total as u64) {
        let part = path.with_extension("part");
        let mut f = File::create(&part).map_err(|e| io("creating", e))?;
        f.write_all(&head).map_err(|e| io("writing", e))?;
        for (w, &n) in downs.iter().zip(&sizes) {
            let mut rows = vec![0u8; aligned(n)];
            transpose_into(&*w.to_rows()?, &mut rows[..n])?;
            f.write_all(&rows).map_err(|e| io("writing", e))?;
        }
        f.sync_all().map_err(|e| io("writing", e))?;
        std::fs::rename(&part, path).map_err(|e| io("renaming", e))?;
    }
    let file = powerinfer_core::files::open_regular(path).map_err(|e| io("opening", e))?;
    // SAFETY: the file is ours (written above or checked against this model's header) and is
    // only read; a process that truncates it under us is outside what a memory map can guard.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io("mapping", e))?;
    ensure!(
        map.len() == total,
        ModelFile,
        "{}: changed while opened",
        path.display()
    );
    let base = map.as_ptr();
    let owner: Arc<dyn Send + Sync> = Arc::new(map);
    let mut at = HEADER;
    let mut out = Vec::with_capacity(downs.len());
    for ((w, &n), &d) in downs.iter().zip(&sizes).zip(&dtypes) {
        // SAFETY: at..at + n lies inside the map (total counts every layer), which `owner`
        // keeps alive and unchanged for as long as the buffer lives.
        let bytes = unsafe { Buffer::borrowed(base.add(at), n, Arc::clone(&owner)) };
        out.push(Weight::new(d, w.cols(), w.rows(), bytes)?);
        at += aligned(n);
    }
    Ok(out)
}
