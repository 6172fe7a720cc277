//! Host↔device transfers of the hybrid executor, counted per layer: every copy goes through a
//! [`Link`], so tests and benchmarks can see how many crossings a decode step takes, and each
//! is timed as its phase ([`HybridPhase::Upload`], [`HybridPhase::Download`], and the wait for
//! the GPU's queued work before a download, [`HybridPhase::GpuWait`]).

use powerinfer_core::Result;
use powerinfer_cuda::{Backend, Elem};

use crate::hybrid::phase_clock::{HybridPhase, Mark, PhaseClock};

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

/// A backend, the counters its copies are charged to, and the step's clock.
pub struct Link<'a, B: Backend> {
    dev: &'a B,
    stats: &'a mut TransferStats,
    clock: &'a mut PhaseClock,
}

impl<'a, B: Backend> Link<'a, B> {
    /// Copies on `dev`, counted in `stats` and timed on `clock`.
    pub fn new(dev: &'a B, stats: &'a mut TransferStats, clock: &'a mut PhaseClock) -> Self {
        Link { dev, stats, clock }
    }

    /// The backend the copies run on.
    pub fn dev(&self) -> &'a B {
        self.dev
    }

    /// Enter `phase` of `slot` on the step's clock (see [`PhaseClock::enter`]).
    pub fn enter(&mut self, slot: usize, phase: HybridPhase) -> Mark {
        self.clock.enter(slot, phase)
    }

    fn slot(&mut self, slot: usize) -> &mut Transfers {
        let last = self.stats.layers.len().saturating_sub(1);
        &mut self.stats.layers[slot.min(last)]
    }

    /// The phase a copy is charged to: `phase`, or the KV caches' sync it is part of.
    fn copy_phase(&self, phase: HybridPhase) -> HybridPhase {
        match self.clock.phase() {
            HybridPhase::KvSync => HybridPhase::KvSync,
            _ => phase,
        }
    }

    /// Count `bytes` of cold FFN rows read for `slot` (see [`PhaseClock::cold_read`]).
    pub fn cold_read(&mut self, slot: usize, bytes: u64) {
        self.clock.cold_read(slot, bytes);
    }

    /// Count `bytes` of predictor weights the CPU read for `slot`.
    pub fn predictor_read(&mut self, slot: usize, bytes: u64) {
        self.clock.predictor_read(slot, bytes);
    }

    /// Host → device, charged to layer `slot`.
    pub fn up<T: Elem>(
        &mut self,
        slot: usize,
        host: &[T],
        dst: &mut B::Buf<T>,
        at: usize,
    ) -> Result<()> {
        let was = self.clock.enter(slot, self.copy_phase(HybridPhase::Upload));
        let done = self.dev.write(host, dst, at);
        self.clock.restore(was);
        done?;
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
        let was = self
            .clock
            .enter(slot, self.copy_phase(HybridPhase::GpuWait));
        let mut done = self.dev.synchronize();
        if done.is_ok() {
            self.clock
                .enter(slot, self.copy_phase(HybridPhase::Download));
            done = self.dev.read(src, at, out);
        }
        self.clock.restore(was);
        done?;
        let t = self.slot(slot);
        t.downloads += 1;
        t.bytes_down += std::mem::size_of_val(out) as u64;
        Ok(())
    }
}
