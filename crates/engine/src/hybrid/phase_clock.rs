//! Where a hybrid decode step's wall time goes, per layer and phase: always on.
//!
//! The executor names the phase it enters ([`PhaseClock::enter`]); the time since the previous
//! switch goes to the phase and layer that were current. Every moment between the start and the
//! end of a step is charged to exactly one (layer, phase), so the phases add up to the step's
//! time. The GPU side is host time: queueing its work (on gpu-sim and gpu-emu, running it, since
//! those backends run each kernel when it is queued) and waiting for it before a download. The
//! CPU side's parallel regions report how long the pool took to start all its threads
//! ([`powerinfer_cpu::take_dispatch`]); that part of a CPU phase is moved to
//! [`HybridPhase::Dispatch`] when the phase ends.
//!
//! Cost: one clock read per switch (58 ns on the 2-core VM this was measured on), about 15
//! switches per layer: some 30 µs a token for 32 layers.

use std::time::Instant;

/// The phases of a hybrid decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridPhase {
    /// Host time queueing GPU work (on gpu-sim and gpu-emu: running it).
    GpuSubmit,
    /// The CPU idle, waiting for queued GPU work to finish before a download.
    GpuWait,
    /// Host → device copies (the residual, the CPU's partial sum, flags, expert weights, KV rows).
    Upload,
    /// Device → host copies, after the GPU work before them finished.
    Download,
    /// The CPU's FFN norm of the block's input.
    CpuNorm,
    /// The CPU's predictor and the active list (or the cold list from the GPU predictor's flags).
    CpuPredictor,
    /// A mixture of experts' routing on the CPU.
    CpuRoute,
    /// The cold neurons' FFN on the CPU (less its dispatch).
    ColdFfn,
    /// CPU parallel regions waiting for their last thread to start.
    Dispatch,
    /// An attention block the plan keeps on the CPU.
    CpuAttention,
    /// An FFN block the plan keeps wholly on the CPU.
    CpuFfn,
    /// The output head on the CPU.
    CpuOutput,
    /// Bringing the GPU layers' KV caches up to date after a batched CPU pass (its copies
    /// included: they are not a decode step's hand-offs).
    KvSync,
    /// The embedding and everything not above.
    Other,
}

impl HybridPhase {
    /// Every phase, in report order.
    pub const ALL: [HybridPhase; 14] = [
        HybridPhase::GpuSubmit,
        HybridPhase::GpuWait,
        HybridPhase::Upload,
        HybridPhase::Download,
        HybridPhase::CpuNorm,
        HybridPhase::CpuPredictor,
        HybridPhase::CpuRoute,
        HybridPhase::ColdFfn,
        HybridPhase::Dispatch,
        HybridPhase::CpuAttention,
        HybridPhase::CpuFfn,
        HybridPhase::CpuOutput,
        HybridPhase::KvSync,
        HybridPhase::Other,
    ];

    /// Name as reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            HybridPhase::GpuSubmit => "gpu_submit",
            HybridPhase::GpuWait => "gpu_wait",
            HybridPhase::Upload => "upload",
            HybridPhase::Download => "download",
            HybridPhase::CpuNorm => "cpu_norm",
            HybridPhase::CpuPredictor => "cpu_predictor",
            HybridPhase::CpuRoute => "cpu_route",
            HybridPhase::ColdFfn => "cold_ffn",
            HybridPhase::Dispatch => "dispatch",
            HybridPhase::CpuAttention => "cpu_attention",
            HybridPhase::CpuFfn => "cpu_ffn",
            HybridPhase::CpuOutput => "cpu_output",
            HybridPhase::KvSync => "kv_sync",
            HybridPhase::Other => "other",
        }
    }

    /// Whether the phase is CPU work whose parallel regions report dispatch time.
    fn on_cpu_pool(self) -> bool {
        matches!(
            self,
            HybridPhase::CpuNorm
                | HybridPhase::CpuPredictor
                | HybridPhase::CpuRoute
                | HybridPhase::ColdFfn
                | HybridPhase::CpuAttention
                | HybridPhase::CpuFfn
                | HybridPhase::CpuOutput
        )
    }
}

const N: usize = HybridPhase::ALL.len();

/// Seconds per (slot, phase): slots are the layers, then the output head.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseStats {
    /// Per slot, seconds per phase in [`HybridPhase::ALL`] order.
    pub slots: Vec<[f64; N]>,
    /// Decode steps timed.
    pub steps: u64,
    /// The steps' wall time, start to end, on the same clock reads as the phases (which add up
    /// to it); a step stopped by an error adds its time but is not counted in `steps`.
    pub step_seconds: f64,
    /// Phase switches made (for the timers' own cost).
    pub switches: u64,
    /// Per slot, bytes of FFN weight rows the CPU side read for the plan's cold neurons.
    pub cold_bytes: Vec<u64>,
    /// Per slot, bytes of predictor weights the CPU read (predictors the plan keeps there).
    pub predictor_bytes: Vec<u64>,
}

impl PhaseStats {
    /// Zero times for `n_layers` layers and the output head.
    pub fn new(n_layers: usize) -> PhaseStats {
        PhaseStats {
            slots: vec![[0.0; N]; n_layers + 1],
            cold_bytes: vec![0; n_layers + 1],
            predictor_bytes: vec![0; n_layers + 1],
            ..PhaseStats::default()
        }
    }

    /// Seconds of `p` summed over the slots.
    pub fn total(&self, p: HybridPhase) -> f64 {
        self.slots.iter().map(|s| s[p as usize]).sum()
    }
}

/// Where the step is: the slot and phase time is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    slot: usize,
    phase: HybridPhase,
}

/// The executor's clock (see the module docs).
#[derive(Debug)]
pub struct PhaseClock {
    stats: PhaseStats,
    at: Mark,
    last: Instant,
    step_start: Instant,
    /// Inside a step (between [`PhaseClock::begin_step`] and [`PhaseClock::end_step`]): time
    /// outside steps (a batched CPU pass's KV copies) is not charged.
    running: bool,
}

impl PhaseClock {
    /// A clock for `n_layers` layers and the output head.
    pub fn new(n_layers: usize) -> PhaseClock {
        let now = Instant::now();
        PhaseClock {
            stats: PhaseStats::new(n_layers),
            at: Mark {
                slot: 0,
                phase: HybridPhase::Other,
            },
            last: now,
            step_start: now,
            running: false,
        }
    }

    /// What has been timed.
    pub fn stats(&self) -> &PhaseStats {
        &self.stats
    }

    /// Zero the times.
    pub fn reset(&mut self) {
        self.stats = PhaseStats::new(self.stats.slots.len().saturating_sub(1));
    }

    /// A step starts now, in [`HybridPhase::Other`] of slot 0.
    pub fn begin_step(&mut self) {
        // Dispatch counted outside the clock's phases is not this step's.
        powerinfer_cpu::take_dispatch();
        let now = Instant::now();
        self.step_start = now;
        self.last = now;
        self.running = true;
        self.at = Mark {
            slot: 0,
            phase: HybridPhase::Other,
        };
    }

    /// The step ends now: the current phase's time is charged, and the step counted when it
    /// `finished` (not stopped by an error; its time stays in the phases and `step_seconds`).
    pub fn end_step(&mut self, finished: bool) {
        let now = self.charge();
        self.running = false;
        self.stats.step_seconds += (now - self.step_start).as_secs_f64();
        self.stats.steps += u64::from(finished);
    }

    /// Charge the time since the last switch to the current (slot, phase); move a CPU phase's
    /// dispatch time to [`HybridPhase::Dispatch`].
    fn charge(&mut self) -> Instant {
        let now = Instant::now();
        let secs = (now - self.last).as_secs_f64();
        self.last = now;
        if !self.running {
            return now;
        }
        let Some(row) = self.stats.slots.get_mut(self.at.slot) else {
            return now;
        };
        let p = self.at.phase;
        let waited = match p.on_cpu_pool() {
            true => powerinfer_cpu::take_dispatch().0.min(secs),
            false => 0.0,
        };
        row[p as usize] += secs - waited;
        row[HybridPhase::Dispatch as usize] += waited;
        self.stats.switches += 1;
        now
    }

    /// The phase time is charged to now.
    pub fn phase(&self) -> HybridPhase {
        self.at.phase
    }

    /// Enter `phase` of `slot`; returns where the step was, for [`PhaseClock::restore`].
    #[inline]
    pub fn enter(&mut self, slot: usize, phase: HybridPhase) -> Mark {
        let before = self.at;
        if before.slot != slot || before.phase != phase {
            self.charge();
            self.at = Mark { slot, phase };
        }
        before
    }

    /// Count `bytes` of cold FFN rows read for `slot`.
    pub fn cold_read(&mut self, slot: usize, bytes: u64) {
        if let Some(b) = self.stats.cold_bytes.get_mut(slot) {
            *b += bytes;
        }
    }

    /// Count `bytes` of predictor weights the CPU read for `slot`.
    pub fn predictor_read(&mut self, slot: usize, bytes: u64) {
        if let Some(b) = self.stats.predictor_bytes.get_mut(slot) {
            *b += bytes;
        }
    }

    /// Go back to `mark` (after a nested phase such as a transfer).
    #[inline]
    pub fn restore(&mut self, mark: Mark) {
        self.enter(mark.slot, mark.phase);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn phases_add_up_to_the_step() {
        let mut c = PhaseClock::new(2);
        c.begin_step();
        std::thread::sleep(Duration::from_millis(3));
        c.enter(1, HybridPhase::ColdFfn);
        std::thread::sleep(Duration::from_millis(4));
        let m = c.enter(1, HybridPhase::Upload);
        std::thread::sleep(Duration::from_millis(1));
        c.restore(m);
        c.enter(2, HybridPhase::GpuSubmit);
        c.end_step(true);
        // Outside a step nothing is charged.
        std::thread::sleep(Duration::from_millis(2));
        c.enter(0, HybridPhase::Upload);
        c.enter(0, HybridPhase::Other);
        let s = c.stats();
        let sum: f64 = s.slots.iter().flatten().sum();
        assert!(
            (sum - s.step_seconds).abs() < 1e-6,
            "{sum} {}",
            s.step_seconds
        );
        assert!(s.slots[0][HybridPhase::Other as usize] >= 0.003);
        assert!(s.slots[1][HybridPhase::ColdFfn as usize] >= 0.004);
        assert!(s.slots[1][HybridPhase::Upload as usize] >= 0.001);
        assert_eq!(s.steps, 1);
        c.reset();
        assert_eq!(c.stats().slots.len(), 3);
        assert_eq!(c.stats().steps, 0);
    }
}
