//! The emulator's barrier timeout (feature `emu`): a block whose thread 0 waits at
//! `__syncthreads` for a thread that waits on thread 0 (emu/selftest.cu) fails the launch with
//! an error naming the barrier, instead of hanging. Its own test binary: the timeout is set to
//! one second for the whole process through `POWERINFER_EMU_TIMEOUT_S`.

#![cfg(feature = "emu")]

use std::time::Instant;

use powerinfer_core::Error;
use powerinfer_cuda::launch_spec::{KernelArgs, LaunchSpec};
use powerinfer_cuda::ops;
use powerinfer_cuda::{Backend, EmuBackend};

#[test]
fn a_barrier_part_of_the_block_never_reaches_times_out() {
    std::env::set_var("POWERINFER_EMU_TIMEOUT_S", "1");
    let dev = EmuBackend::default();
    let mut flag = dev.zeros::<i32>(1).unwrap();
    let mut a = KernelArgs::default();
    // Thread 1 waits until the launch has failed (60 s at most).
    a.ptr(dev.addr_mut(&mut flag)).i32(60_000);
    let module = &ops::elementwise::launch::SOURCE;
    let spec = LaunchSpec::new(
        module,
        "emu_selftest_barrier_deadlock".into(),
        [1, 1],
        2,
        0,
        a,
    );
    let t = Instant::now();
    let out = dev.run(spec);
    let Err(Error::Cuda(m)) = out else {
        panic!("the deadlock was not reported: {out:?}");
    };
    assert!(
        m.contains("__syncthreads") && m.contains("never arrived"),
        "{m}"
    );
    assert!(t.elapsed().as_secs_f64() < 30.0, "{:?}", t.elapsed());
}
