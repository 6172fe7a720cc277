//! The raw launch on a GPU (feature `cuda`): the [`LaunchSpec`] of a checked [`Launch`]
//! (`launch_spec.rs`, the description the emulator runs too) handed to `cuLaunchKernel` on
//! the device's stream, or queued for the next graph batch when graphs are on
//! ([`crate::graph`]). Nothing here waits for the GPU.

use cudarc::driver::result;
use powerinfer_core::Result;

use crate::backend::Launch;
use crate::device::{driver_err, CudaDevice};
use crate::launch_spec::launch_spec;

impl CudaDevice {
    /// Queue `launch` on this device's stream (the body of [`Backend::launch`]).
    ///
    /// [`Backend::launch`]: crate::Backend::launch
    pub(crate) fn launch_kernel(&self, launch: Launch<'_, CudaDevice>) -> Result<()> {
        let spec = launch_spec(self, launch)?;
        // With graphs on, queued for the next batch (crate::graph).
        let Some(mut spec) = self.queue(spec) else {
            return Ok(());
        };
        let f = self.function(spec.module, &spec.entry)?;
        let mut params = spec.args.pointers();
        self.bind()?;
        let [gx, gy, gz] = spec.grid;
        let [bx, by, bz] = spec.block;
        // SAFETY: `params` points at the packed arguments of `spec`, alive until this returns
        // (cuLaunchKernel copies them). launch_spec built them from a Launch whose shapes ops
        // checked, in the kernel's parameter order with its widths: the emulator checks count
        // and widths against the compiled kernel on every launch, tests/nvrtc_ptx.rs against
        // the PTX; the grid, block and shared bytes are the ones the kernel's comment asks for.
        // Buffers are device allocations of this context, used on this one stream only.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                (gx, gy, gz),
                (bx, by, bz),
                spec.shared_bytes,
                self.stream().cu_stream(),
                &mut params,
            )
        }
        .map_err(driver_err(&format!("launching {}", spec.entry)))
    }
}
