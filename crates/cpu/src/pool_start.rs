//! How long the sparse ops' parallel regions wait for the pool's threads: the "dispatch" phase
//! of the hybrid executor's timers.
//!
//! A region (the split of [`crate::ops`]' sparse kernels over rayon) notes when it begins and,
//! per pool thread, when that thread starts its first task. The region's dispatch time is the
//! delay until the last of its threads started: the time the pool took to be fully at work
//! (the calling thread starts at once; the others wake from sleep or steal). It is added to a
//! counter of the calling thread, which [`take_dispatch`] reads and zeroes. Always on: one clock
//! read and one atomic store per task (at most a few dozen per region).
//!
//! A thread woken from sleep starts late: on a VM whose idle vCPU halts, tens of microseconds.
//! [`warm_pool`] wakes the pool's other threads ahead of a region (the hybrid executor calls it
//! as a layer starts, before the GPU's part is queued) and keeps them spinning until a region
//! begins or a deadline passes, so that they are already running when the work arrives.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Pool threads tracked per region; threads beyond share slots (the delay is then a lower bound).
const SLOTS: usize = 32;

thread_local! {
    /// Seconds of dispatch and regions counted on this thread since the last take.
    static WAITED: Cell<(f64, u64)> = const { Cell::new((0.0, 0)) };
}

/// Regions begun so far (any pool): a warm thread stops spinning when it changes.
static REGIONS_BEGUN: AtomicU64 = AtomicU64::new(0);

/// Wake the current pool's other threads now and keep each spinning until the next parallel
/// region of the sparse ops begins (anywhere) or `max` has passed, whichever is first. Returns
/// at once; nothing to do on a pool of one thread or with `max` zero. The spinning threads
/// take no work meanwhile: call it when the calling thread has only short work (queueing GPU
/// launches) before its next region.
pub fn warm_pool(max: Duration) {
    let me = rayon::current_thread_index();
    if max.is_zero() || rayon::current_num_threads() <= 1 || me.is_none() {
        return;
    }
    let seen = REGIONS_BEGUN.load(Ordering::Relaxed);
    rayon::spawn_broadcast(move |ctx| {
        if Some(ctx.index()) == me {
            return;
        }
        let t = Instant::now();
        while REGIONS_BEGUN.load(Ordering::Relaxed) == seen && t.elapsed() < max {
            std::hint::spin_loop();
        }
    });
}

/// Seconds this thread's parallel regions spent waiting for their last thread to start, and how
/// many regions ran in parallel, since the previous call (then zero).
pub fn take_dispatch() -> (f64, u64) {
    WAITED.with(|w| w.replace((0.0, 0)))
}

/// One parallel region's start times.
pub(crate) struct Region {
    entry: Instant,
    /// Per pool thread: nanoseconds after `entry` of its first task, plus 1 (0: not started).
    first: [AtomicU64; SLOTS],
}

impl Region {
    /// A region beginning now.
    pub(crate) fn begin() -> Region {
        REGIONS_BEGUN.fetch_add(1, Ordering::Relaxed);
        Region {
            entry: Instant::now(),
            first: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// A task starts on the current thread.
    #[inline]
    pub(crate) fn task(&self) {
        let slot = rayon::current_thread_index().unwrap_or(0) % SLOTS;
        if self.first[slot].load(Ordering::Relaxed) == 0 {
            let ns = self.entry.elapsed().as_nanos() as u64 + 1;
            // Only the first task of the thread sets it (a later one sees it set).
            let _ = self.first[slot].compare_exchange(0, ns, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The region's tasks are done: add its dispatch delay to the calling thread's counter.
    pub(crate) fn end(self) {
        let last = self
            .first
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        WAITED.with(|w| {
            let (secs, n) = w.get();
            w.set((secs + last as f64 * 1e-9, n + 1));
        });
    }
}

/// The current pool's dispatch after `idle` without work (its threads asleep, as between two
/// layers' CPU parts while the GPU works): the median over `rounds` of the delay until the last
/// thread started a region of short tasks (about 20 µs each, a few per thread), in seconds.
/// The planner adds it to the cost of a layer split between the devices. With `warm`, the pool
/// is warmed ([`warm_pool`], for `idle` plus 1 ms) before the idle time, as the hybrid executor
/// does before each layer.
pub fn measure_dispatch(rounds: usize, idle: Duration, warm: bool) -> f64 {
    use rayon::prelude::*;
    const TASK: Duration = Duration::from_micros(20);
    let tasks = 4 * rayon::current_num_threads();
    let mut delays: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            if warm {
                warm_pool(idle + Duration::from_millis(1));
            }
            std::thread::sleep(idle);
            let region = Region::begin();
            (0..tasks).into_par_iter().for_each(|_| {
                region.task();
                let t = Instant::now();
                while t.elapsed() < TASK {
                    std::hint::spin_loop();
                }
            });
            region.end();
            take_dispatch().0
        })
        .collect();
    delays.sort_by(f64::total_cmp);
    delays[delays.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_is_until_the_last_thread_started() {
        take_dispatch();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let r = Region::begin();
        // Each pool thread once; thread 1 starts 5 ms late.
        pool.broadcast(|ctx| {
            if ctx.index() == 1 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r.task();
        });
        r.end();
        let (secs, n) = take_dispatch();
        assert_eq!(n, 1);
        assert!((0.005..1.0).contains(&secs), "{secs}");
        assert_eq!(take_dispatch(), (0.0, 0));
    }

    #[test]
    fn warm_threads_stop_spinning_when_a_region_begins() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let t = Instant::now();
        pool.install(|| {
            // Spinners told to stop after 30 s stop at the region instead: the broadcast after
            // it runs on both threads at once (it waits for a spinner's job to return).
            warm_pool(Duration::from_secs(30));
            std::thread::sleep(Duration::from_millis(5));
            Region::begin().end();
            rayon::broadcast(|_| ());
        });
        take_dispatch();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
}
