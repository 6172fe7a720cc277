//! A vector that lives on both sides (the residual stream, a parallel block's saved input): a
//! host copy and a device copy, and which of them hold its current value. A step that reads it
//! on one side makes that side current first, one transfer when only the other side has it;
//! a step that writes it on one side leaves the other side stale.

use powerinfer_core::{Result, Side};
use powerinfer_cuda::Backend;

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
