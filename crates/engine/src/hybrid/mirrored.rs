//! A vector that lives on both sides (the residual stream, a parallel block's saved input): a
//! host copy and a device copy, and which of them hold its current value. A step that reads it
//! on one side makes that side current first, one transfer when only the other side has it;
//! a step that writes it on one side leaves the other side stale.

use powerinfer_core::{bail, Result, Side};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::Backend;

use crate::forward::Scratch;
use crate::hybrid::gpu_model::GpuScratch;
use crate::hybrid::transfers::Link;

/// Which copies of a mirrored vector hold its current value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mirrored {
    host: bool,
    device: bool,
}

impl Mirrored {
    /// Current on `side` only (it was just written there).
    pub fn only(side: Side) -> Mirrored {
        Mirrored {
            host: side == Side::Cpu,
            device: side == Side::Gpu,
        }
    }

    /// Whether `side`'s copy is current.
    pub fn is_on(self, side: Side) -> bool {
        match side {
            Side::Cpu => self.host,
            Side::Gpu => self.device,
        }
    }

    /// `side`'s copy was written: the other one is stale.
    pub fn wrote(&mut self, side: Side) {
        *self = Mirrored::only(side);
    }

    /// Make `side`'s copy current: a download into `host` (`len` values) or an upload from it,
    /// charged to `slot`, when only the other side has the value; nothing when it has it.
    pub fn make_current<B: Backend>(
        &mut self,
        side: Side,
        link: &mut Link<'_, B>,
        slot: usize,
        host: &mut Vec<f32>,
        len: usize,
        device: &mut B::Buf<f32>,
    ) -> Result<()> {
        if self.is_on(side) {
            return Ok(());
        }
        match side {
            Side::Cpu => {
                host.resize(len, 0.0);
                link.down(slot, device, 0, host)?;
                self.host = true;
            }
            Side::Gpu => {
                link.up(slot, host, device, 0)?;
                self.device = true;
            }
        }
        Ok(())
    }
}

/// A vector the executor keeps on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vector {
    /// The residual stream (`host.x`, `sc.x`).
    Residual,
    /// A parallel block's saved input (`host.par_in`, `sc.saved`).
    Saved,
}

/// Where the executor's mirrored vectors are current: the residual stream and a parallel
/// block's saved input (their host copies in the CPU's [`Scratch`], their device copies in the
/// [`GpuScratch`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Streams {
    pub x: Mirrored,
    pub saved: Mirrored,
}

/// The device buffer of a parallel block's saved input.
fn saved_buf<B: Backend>(sc: &mut GpuScratch<B>) -> Result<&mut B::Buf<f32>> {
    match sc.saved.as_mut() {
        Some(saved) => Ok(saved),
        None => bail!(Other, "no GPU buffer for a parallel block's input"),
    }
}

impl Streams {
    /// Make `side`'s copy of `v` current (a transfer charged to `slot` when only the other
    /// side has it).
    pub fn current<B: Backend>(
        &mut self,
        v: Vector,
        side: Side,
        slot: usize,
        link: &mut Link<'_, B>,
        host: &mut Scratch,
        sc: Option<&mut GpuScratch<B>>,
    ) -> Result<()> {
        let mirror = match v {
            Vector::Residual => &mut self.x,
            Vector::Saved => &mut self.saved,
        };
        if mirror.is_on(side) {
            return Ok(());
        }
        let Some(sc) = sc else {
            bail!(Other, "no GPU scratch buffers");
        };
        let len = host.x.len();
        let (host, device) = match v {
            Vector::Residual => (&mut host.x, &mut sc.x),
            Vector::Saved => (&mut host.par_in, saved_buf(sc)?),
        };
        mirror.make_current(side, link, slot, host, len, device)
    }

    /// A parallel block starts: keep the residual as its FFN's input, on each side that has it
    /// (a copy, no transfer).
    pub fn save_residual<B: Backend>(
        &mut self,
        dev: &B,
        host: &mut Scratch,
        sc: Option<&mut GpuScratch<B>>,
    ) -> Result<()> {
        self.saved = self.x;
        if self.x.is_on(Side::Cpu) {
            host.par_in.clone_from(&host.x);
        }
        if self.x.is_on(Side::Gpu) {
            let Some(sc) = sc else {
                bail!(Other, "no GPU scratch buffers");
            };
            let Some(saved) = sc.saved.as_mut() else {
                bail!(Other, "no GPU buffer for a parallel block's input");
            };
            dev.copy(saved, &sc.x)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hybrid::phase_clock::PhaseClock;
    use crate::hybrid::transfers::TransferStats;
    use powerinfer_cuda::HostBackend;

    #[test]
    fn a_side_is_made_current_by_one_transfer_and_only_when_stale() -> Result<()> {
        let dev = HostBackend::new();
        let (mut stats, mut clock) = (TransferStats::new(1), PhaseClock::new(1));
        let mut link = Link::new(&dev, &mut stats, &mut clock);
        let mut host = vec![1.0f32, 2.0, 3.0];
        let mut device = dev.zeros::<f32>(3)?;
        let mut m = Mirrored::only(Side::Cpu);
        assert!(m.is_on(Side::Cpu) && !m.is_on(Side::Gpu));
        for _ in 0..2 {
            m.make_current(Side::Gpu, &mut link, 0, &mut host, 3, &mut device)?;
            m.make_current(Side::Cpu, &mut link, 0, &mut host, 3, &mut device)?;
        }
        assert!(m.is_on(Side::Cpu) && m.is_on(Side::Gpu));
        dev.write(&[4.0f32, 5.0, 6.0], &mut device, 0)?;
        m.wrote(Side::Gpu);
        assert!(!m.is_on(Side::Cpu));
        // Into a host copy of another length (a saved input not kept on the host yet).
        let mut saved = Vec::new();
        m.make_current(Side::Cpu, &mut link, 1, &mut saved, 3, &mut device)?;
        assert_eq!(saved, [4.0, 5.0, 6.0]);
        let (up, down) = (stats.layers[0], stats.layers[1]);
        assert_eq!((up.uploads, up.downloads, up.bytes_up), (1, 0, 12));
        assert_eq!((down.uploads, down.downloads, down.bytes_down), (0, 1, 12));
        Ok(())
    }
}
