//! The compaction family (`kernels/compact.cu`): lists gathered on the GPU, in order, with
//! their count in a device int that the kernels reading them take (the host never waits for
//! it): the hot slots whose neuron is active (the gate/up pass over them), and the rows whose
//! coefficient is not 0 (the down pass over them). Checked ([`CompactOps`]), launched
//! ([`launch`]) and run on host memory (`host`).

use powerinfer_core::{ensure, Result};

use crate::backend::{Backend, Checked, DeviceSlice, HotFfn};

pub(crate) mod host;
pub mod launch;

use launch::{CompactFlags, CompactNonzero};

/// A list a compaction writes on the device: `idx` (and, for a down pass's rows, their
/// coefficients `a`) with room for `len` entries, and `count`, one int: how many it holds.
pub struct Compacted<B: Backend> {
    /// The entries (slot or row indices).
    pub idx: B::Buf<i32>,
    /// Their coefficients, for a down pass's rows.
    pub a: Option<B::Buf<f32>>,
    /// One int: how many entries.
    pub count: B::Buf<i32>,
}

impl<B: Backend> Compacted<B> {
    /// Room for `len` entries (with coefficients when `coefficients`), zero-filled.
    pub fn zeros(dev: &B, len: usize, coefficients: bool) -> Result<Compacted<B>> {
        Ok(Compacted {
            idx: dev.zeros(len)?,
            a: coefficients.then(|| dev.zeros(len)).transpose()?,
            count: dev.zeros(1)?,
        })
    }

    /// `Error::Shape` unless it has room for `n` entries and a count.
    pub(crate) fn check(&self, n: usize, what: &str) -> Result<()> {
        let a = self.a.as_ref().map_or(n, |a| a.len());
        ensure!(
            self.idx.len() >= n && a >= n && !self.count.is_empty(),
            Shape,
            "{what}: a list of {} entries ({} coefficients, {} counts) for {n}",
            self.idx.len(),
            a,
            self.count.len()
        );
        Ok(())
    }
}

/// The compactions, checked, on any backend.
pub trait CompactOps: Backend {
    /// The hot slots of `ffn` whose neuron is active (`flags`: one i32 per FFN neuron), in slot
    /// order, into `out` (no coefficients needed).
    fn active_slots(
        &self,
        ffn: &HotFfn<Self>,
        flags: &Self::Buf<i32>,
        out: &mut Compacted<Self>,
    ) -> Result<()> {
        let l = &ffn.layout;
        ensure!(
            flags.len() >= l.ffn,
            Shape,
            "active_slots: {} flags for ffn {}",
            flags.len(),
            l.ffn
        );
        out.check(l.n_hot, "active_slots")?;
        if l.n_hot == 0 {
            return Ok(());
        }
        let launch = CompactFlags {
            slabs: &ffn.data,
            ids_l: l.ids,
            flags,
            n: l.n_hot,
            out_idx: &mut out.idx,
            count: &mut out.count,
        };
        self.launch(launch, Checked(()))
    }

    /// The down pass's rows of `ffn`: the hot slots whose activation `h` is not 0, with it, into
    /// `out` (which needs coefficients). `h` holds one value per hot slot, or with `slots` one per
    /// entry of that list (gate_up over the active slots), whose count bounds it.
    fn nonzero_rows(
        &self,
        ffn: &HotFfn<Self>,
        h: &Self::Buf<f32>,
        slots: Option<&Compacted<Self>>,
        out: &mut Compacted<Self>,
    ) -> Result<()> {
        let n = ffn.layout.n_hot;
        ensure!(
            h.len() >= n,
            Shape,
            "nonzero_rows: h {} for {n} hot",
            h.len()
        );
        if let Some(s) = slots {
            s.check(n, "nonzero_rows (slots)")?;
        }
        out.check(n, "nonzero_rows")?;
        if n == 0 {
            return Ok(());
        }
        let Compacted { idx, a, count } = out;
        let Some(a) = a.as_mut() else {
            powerinfer_core::bail!(Shape, "nonzero_rows: a list without coefficients");
        };
        let launch = CompactNonzero {
            a: h,
            idx: slots.map(|s| &s.idx),
            count_in: slots.map(|s| &s.count),
            n,
            out_idx: idx,
            out_a: a,
            count,
        };
        self.launch(launch, Checked(()))
    }
}

impl<B: Backend> CompactOps for B {}
