//! Host↔device transfers of the hybrid executor, counted per layer: every copy goes through a
//! [`Link`], so tests and benchmarks can see how many crossings a decode step takes.

use powerinfer_core::Result;
use powerinfer_cuda::{Backend, Elem};

/// Copies in each direction and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    pub uploads: u64,
    pub downloads: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

/// Transfers per layer (the last slot: the output head), and decode steps run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    pub layers: Vec<Transfers>,
    pub steps: u64,
}

impl TransferStats {
    /// Zero counts for `n_layers` layers and the output head.
    pub fn new(n_layers: usize) -> TransferStats {
        TransferStats {
            layers: vec![Transfers::default(); n_layers + 1],
            steps: 0,
        }
    }
}

/// A backend and the counters its copies are charged to.
pub struct Link<'a, B: Backend> {
    dev: &'a B,
    stats: &'a mut TransferStats,
}

impl<'a, B: Backend> Link<'a, B> {
    /// Copies on `dev`, counted in `stats`.
    pub fn new(dev: &'a B, stats: &'a mut TransferStats) -> Self {
        Link { dev, stats }
    }

    fn slot(&mut self, slot: usize) -> &mut Transfers {
        let last = self.stats.layers.len().saturating_sub(1);
        &mut self.stats.layers[slot.min(last)]
    }

    /// Host → device, charged to layer `slot`.
    pub fn up<T: Elem>(
        &mut self,
        slot: usize,
        host: &[T],
        dst: &mut B::Buf<T>,
        at: usize,
    ) -> Result<()> {
        self.dev.write(host, dst, at)?;
        let t = self.slot(slot);
        t.uploads += 1;
        t.bytes_up += std::mem::size_of_val(host) as u64;
        Ok(())
    }

    /// Device → host, charged to layer `slot`.
    pub fn down<T: Elem>(
        &mut self,
        slot: usize,
        src: &B::Buf<T>,
        at: usize,
        out: &mut [T],
    ) -> Result<()> {
        self.dev.read(src, at, out)?;
        let t = self.slot(slot);
        t.downloads += 1;
        t.bytes_down += std::mem::size_of_val(out) as u64;
        Ok(())
    }
}
