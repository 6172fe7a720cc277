//! The hybrid executor's settings read from the environment, for measuring one path against
//! another on a GPU.

use std::time::Duration;

/// `POWERINFER_RS_POOL_SPIN_US`: microseconds the CPU pool's threads spin for a layer's CPU part,
/// woken as the layer starts (default [`POOL_SPIN_US`]; 0: they sleep between layers and wake
/// when the work arrives, tens of microseconds later on a VM whose idle vCPU halts).
pub const POOL_SPIN_ENV: &str = "POWERINFER_RS_POOL_SPIN_US";
/// Default of [`POOL_SPIN_ENV`]: longer than a layer's GPU part on the GPUs we plan for (about
/// 0.2 ms for a 7B layer at 40% of its bytes on an H200), so the threads are running when the
/// CPU's part begins; a bound on the core time a layer without CPU work wastes.
pub const POOL_SPIN_US: u64 = 1000;

/// `POWERINFER_RS_GPU_GATHER=0` runs the hot FFN without the lists gathered on the GPU: gate/up
/// over every hot slot testing its flag, the down pass over every hot row testing its
/// coefficient (the path before compact.cu), for measuring one against the other on a GPU.
pub const GATHER_ENV: &str = "POWERINFER_RS_GPU_GATHER";

/// The settings, as the environment has them when an executor is made.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// Whether the hot FFN runs over lists gathered on the GPU (the default; see
    /// [`GATHER_ENV`]) in the sparse modes (dense rows gather nothing).
    pub gather: bool,
    /// How long the CPU pool's threads spin, woken as a layer with cold neurons starts, waiting
    /// for its CPU part (see [`POOL_SPIN_ENV`]).
    pub pool_spin: Duration,
}

impl Knobs {
    /// Read from the environment (an unparsable spin is the default).
    pub fn from_env() -> Knobs {
        Knobs {
            gather: std::env::var(GATHER_ENV).map_or(true, |v| v != "0"),
            pool_spin: Duration::from_micros(
                std::env::var(POOL_SPIN_ENV)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(POOL_SPIN_US),
            ),
        }
    }
}
