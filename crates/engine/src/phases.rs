//! Where a forward pass's time goes, phase by phase: an opt-in clock for benchmarks.
//!
//! A [`Session`](crate::Session) with phase timing on runs each forward pass inside
//! [`timed`], which installs its [`PhaseTimes`] for the calling thread; the forward pass calls
//! [`mark`] at each phase boundary, charging the time since the previous mark to the phase that
//! just ended. Without timing, [`mark`] is one thread-local read and a branch. Phase boundaries
//! sit on the calling thread, between parallel regions, so each phase's time includes the
//! fork/join of its own regions: a phase's time against its bytes shows both its read speed and
//! the synchronisation around it.

use std::cell::RefCell;
use std::time::Instant;

/// The phases of a forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Embedding rows, norms, RoPE tables: everything not below.
    Other,
    /// Attention: the q/k/v projections, the attention over the cache, the output projection.
    Attention,
    /// The activation predictor (fc1, then the fc2 rows of its nonzero hidden units).
    Predictor,
    /// The gate and up products, in one pass (dense and threshold decode, every batched pass).
    Gate,
    /// The down product (down_t rows of the neurons that fire, or the dense down).
    Down,
    /// A sparse decode step's whole FFN in one parallel region (exact-relu and predictor
    /// modes: gate rows, then the up and down_t rows of the neurons that fire).
    Ffn,
    /// Final norm and output head.
    Output,
}

impl Phase {
    /// Every phase, in report order.
    pub const ALL: [Phase; 7] = [
        Phase::Attention,
        Phase::Predictor,
        Phase::Gate,
        Phase::Down,
        Phase::Ffn,
        Phase::Output,
        Phase::Other,
    ];

    /// Name as reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Attention => "attention",
            Phase::Predictor => "predictor",
            Phase::Gate => "gate",
            Phase::Down => "down",
            Phase::Ffn => "ffn",
            Phase::Output => "output",
        }
    }
}

/// Seconds spent in each phase, and how many forward passes and tokens they cover.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    seconds: [f64; Phase::ALL.len()],
    /// Forward passes timed.
    pub passes: u64,
    /// Tokens those passes ran.
    pub tokens: u64,
}

impl PhaseTimes {
    /// Seconds charged to `p`.
    pub fn seconds(&self, p: Phase) -> f64 {
        self.seconds[p as usize]
    }

    /// `(name, seconds)` of every phase, in report order.
    pub fn by_name(&self) -> Vec<(&'static str, f64)> {
        Phase::ALL
            .iter()
            .map(|&p| (p.name(), self.seconds(p)))
            .collect()
    }
}

struct Clock {
    times: PhaseTimes,
    last: Instant,
}

thread_local! {
    static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

/// Charge the time since the previous mark to `p` (nothing when no clock is installed).
#[inline]
pub fn mark(p: Phase) {
    CLOCK.with(|c| {
        if let Some(clock) = c.borrow_mut().as_mut() {
            let now = Instant::now();
            clock.times.seconds[p as usize] += (now - clock.last).as_secs_f64();
            clock.last = now;
        }
    });
}

/// Run `f` (a forward pass over `tokens` tokens) with `times` as this thread's clock, or just
/// run it when `times` is None; the time after the last mark goes to [`Phase::Other`].
pub fn timed<T>(times: Option<&mut PhaseTimes>, tokens: usize, f: impl FnOnce() -> T) -> T {
    let Some(times) = times else {
        return f();
    };
    let start = Clock {
        times: std::mem::take(times),
        last: Instant::now(),
    };
    CLOCK.with(|c| *c.borrow_mut() = Some(start));
    let out = f();
    mark(Phase::Other);
    if let Some(mut clock) = CLOCK.with(|c| c.borrow_mut().take()) {
        clock.times.passes += 1;
        clock.times.tokens += tokens as u64;
        *times = clock.times;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn marks_charge_the_phase_that_ended() {
        let mut t = PhaseTimes::default();
        timed(Some(&mut t), 3, || {
            std::thread::sleep(Duration::from_millis(20));
            mark(Phase::Attention);
            std::thread::sleep(Duration::from_millis(5));
            mark(Phase::Down);
        });
        assert!(t.seconds(Phase::Attention) >= 0.02);
        assert!(t.seconds(Phase::Down) >= 0.005 && t.seconds(Phase::Down) < 0.02);
        assert_eq!((t.passes, t.tokens), (1, 3));
        // without a clock, marks do nothing and the times stay
        mark(Phase::Attention);
        let before = t.clone();
        timed(Some(&mut t), 1, || {});
        assert_eq!(
            t.seconds(Phase::Attention),
            before.seconds(Phase::Attention)
        );
        assert_eq!((t.passes, t.tokens), (2, 4));
    }
}
