//! The neuron store's reads: a pool of threads issuing `pread`s on the store file, several in
//! flight at once, each into a pinned cache slot, with the page cache bypassed (`O_DIRECT`)
//! where the file system allows. A batch of reads is waited for as a whole; a failed read (or a
//! reader that panicked) ends its batch with an error, never a hang.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use powerinfer_core::{ensure, Error, PageBuf, Result};

use super::format::ALIGN;

/// `O_DIRECT`'s value on Linux: 0o40000 on x86-64, 0o200000 on aarch64 (0 elsewhere: the page
/// cache is used).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
const O_DIRECT: i32 = 0o40000;
#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
const O_DIRECT: i32 = 0o200000;
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
const O_DIRECT: i32 = 0;

/// The most reader threads a store or a storage probe starts.
pub const MAX_IO_THREADS: usize = 256;

/// A destination address handed to a reader thread.
struct Dst(*mut u8);

// SAFETY: the address is a pinned cache slot that only this read writes until its batch is
// waited for (see `Batch`); nothing else touches those bytes meanwhile.
unsafe impl Send for Dst {}

/// One read.
struct Job {
    offset: u64,
    len: usize,
    dst: Dst,
    batch: Arc<Batch>,
}

/// Reads waited for together: how many are left and the first error.
pub(super) struct Batch {
    state: Mutex<(usize, Option<String>)>,
    done: Condvar,
}

impl Batch {
    /// A batch of `n` reads.
    pub(super) fn new(n: usize) -> Arc<Batch> {
        Arc::new(Batch {
            state: Mutex::new((n, None)),
            done: Condvar::new(),
        })
    }

    fn finish(&self, err: Option<String>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = s.0.saturating_sub(1);
        if s.1.is_none() {
            s.1 = err;
        }
        if s.0 == 0 {
            self.done.notify_all();
        }
    }

    /// Wait for every read; the first failure as `Error::ModelFile`.
    pub(super) fn wait(&self, source: &str) -> Result<()> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.0 > 0 {
            s = self.done.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        match s.1.take() {
            Some(e) => Err(Error::ModelFile(format!("{source}: {e}"))),
            None => Ok(()),
        }
    }
}

/// Reader threads over one open store file.
pub(super) struct IoPool {
    tx: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// Whether the file was opened with `O_DIRECT` (reads bypass the page cache).
    pub(super) direct: bool,
}

/// Open `path` (a regular file) for reading, with `O_DIRECT` when the file system takes it and
/// an aligned read of the first block succeeds that way.
fn open(path: &Path) -> Result<(File, bool)> {
    let io = |e: std::io::Error| Error::ModelFile(format!("{}: {e}", path.display()));
    if O_DIRECT != 0 {
        if let Ok(f) = powerinfer_core::files::open_regular_with(path, O_DIRECT) {
            let mut probe = PageBuf::zeroed(2 * ALIGN);
            let buf = probe.as_mut_slice();
            let at = buf.as_ptr().align_offset(ALIGN);
            if f.read_exact_at(&mut buf[at..at + ALIGN], 0).is_ok() {
                return Ok((f, true));
            }
        }
    }
    Ok((
        powerinfer_core::files::open_regular(path).map_err(io)?,
        false,
    ))
}

impl IoPool {
    /// `threads` readers (at least one) on the file at `path`.
    pub(super) fn open(path: &Path, threads: usize) -> Result<IoPool> {
        ensure!(
            threads <= MAX_IO_THREADS,
            Shape,
            "{threads} reader threads: at most {MAX_IO_THREADS} (a few per storage device pay; \
             more only queue)"
        );
        let (file, direct) = open(path)?;
        let file = Arc::new(file);
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let workers = (0..threads.max(1))
            .map(|i| {
                let (file, rx) = (Arc::clone(&file), Arc::clone(&rx));
                std::thread::Builder::new()
                    .name(format!("neuron-io-{i}"))
                    .spawn(move || reader(&file, &rx))
                    .map_err(|e| Error::Other(format!("starting a neuron reader thread: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(IoPool {
            tx: Some(tx),
            workers,
            direct,
        })
    }

    /// Queue a read of `len` bytes at `offset` into `dst`, counted in `batch`.
    ///
    /// # Safety
    /// `dst..dst + len` must be writable, aligned to [`ALIGN`], and touched by nothing else
    /// until `batch` has been waited for.
    pub(super) unsafe fn submit(&self, offset: u64, len: usize, dst: *mut u8, batch: &Arc<Batch>) {
        let job = Job {
            offset,
            len,
            dst: Dst(dst),
            batch: Arc::clone(batch),
        };
        let sent = self.tx.as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            batch.finish(Some("the neuron readers have stopped".into()));
        }
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.tx = None; // the readers' receive fails: they end
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The storage probe: random reads of `block` bytes (a multiple of [`ALIGN`], at aligned
/// offsets) over the file at `path`, by `threads` readers as the store reads (O_DIRECT where
/// the file system takes it), four reads per reader in flight or queued, for about `seconds`. Returns
/// (reads, elapsed seconds, whether the page cache was bypassed).
pub fn probe_reads(
    path: &Path,
    block: usize,
    threads: usize,
    seconds: f64,
) -> Result<(u64, f64, bool)> {
    let io = |e: std::io::Error| Error::ModelFile(format!("{}: {e}", path.display()));
    let size = std::fs::metadata(path).map_err(io)?.len() as usize;
    if block == 0 || !block.is_multiple_of(ALIGN) || size < block + ALIGN {
        return Err(Error::Shape(format!(
            "probe reads of {block} bytes (a positive multiple of {ALIGN}) in a file of {size}"
        )));
    }
    let wave = 4 * threads.max(1);
    // Two waves in turn, each with its own buffers: one is read while the other is refilled,
    // so the readers' queue never runs dry (as the store's does not within a layer). `buf` is
    // declared before `pool`: dropped after it, whose drop lets every queued read finish.
    ensure!(
        threads <= MAX_IO_THREADS,
        Shape,
        "{threads} reader threads: at most {MAX_IO_THREADS}"
    );
    let mut buf = PageBuf::try_zeroed(
        (2 * wave)
            .checked_mul(block)
            .and_then(|n| n.checked_add(ALIGN))
            .ok_or_else(|| Error::Shape(format!("probe reads of {block} bytes")))?,
    )?;
    let pool = IoPool::open(path, threads)?;
    let raw = buf.as_mut_slice().as_mut_ptr();
    let base = raw.wrapping_add(raw.align_offset(ALIGN));
    let slots = ((size - block) / ALIGN) as u64;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut submit = |half: usize| {
        let batch = Batch::new(wave);
        for i in 0..wave {
            // xorshift64: offsets spread over the file.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let offset = (state % slots) * ALIGN as u64;
            let dst = base.wrapping_add((half * wave + i) * block);
            // SAFETY: each read in flight has its own `block` bytes of `buf` (this half's),
            // aligned to ALIGN, which nothing touches until its batch is waited for below.
            unsafe { pool.submit(offset, block, dst, &batch) };
        }
        batch
    };
    let source = path.display().to_string();
    let t0 = std::time::Instant::now();
    let mut waves = [submit(0), submit(1)];
    let mut reads = 0u64;
    let mut half = 0;
    loop {
        if let Err(e) = waves[half].wait(&source) {
            // The other wave still writes into `buf`: wait for it before `buf` goes.
            let _ = waves[1 - half].wait(&source);
            return Err(e);
        }
        reads += wave as u64;
        if t0.elapsed().as_secs_f64() >= seconds {
            waves[1 - half].wait(&source)?;
            reads += wave as u64;
            break;
        }
        waves[half] = submit(half);
        half = 1 - half;
    }
    Ok((reads, t0.elapsed().as_secs_f64(), pool.direct))
}

/// A reader thread: take jobs until the pool is dropped.
fn reader(file: &File, rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let Ok(rx) = rx.lock() else { return };
            match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            }
        };
        let (offset, len, dst) = (job.offset, job.len, job.dst.0);
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            // SAFETY: `submit`'s contract: the bytes are writable and ours alone until the
            // batch is waited for, which happens after this job finishes.
            let buf = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            file.read_exact_at(buf, offset)
        }));
        let err = match read {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("reading {len} bytes at {offset}: {e}")),
            Err(_) => Some(format!("the read of {len} bytes at {offset} panicked")),
        };
        job.batch.finish(err);
    }
}
