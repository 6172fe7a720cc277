//! Whether this build and machine can run a [`Device`]: the one place the refusals of a device
//! that parses but is not here are written (the session, the hybrid executor and the Python
//! API through `_core.check_device` all ask it). The grammar itself is
//! [`powerinfer_core::Device`]'s.

use powerinfer_core::{bail, Device, Result};

/// Parse `name` and check this build (and, for CUDA, this machine) can run it: the canonical
/// device. [`Error::Unsupported`](powerinfer_core::Error::Unsupported) for a name outside the
/// grammar or gpu-emu in a build without the emulator; [`Error::Cuda`](powerinfer_core::Error::Cuda)
/// for CUDA in a build without it, or an ordinal past the devices found.
pub fn check_device(name: &str) -> Result<Device> {
    let device = Device::parse(name)?;
    check_available(device)?;
    Ok(device)
}

/// Check this build (and, for CUDA, this machine) can run `device` (see [`check_device`]).
pub fn check_available(device: Device) -> Result<()> {
    match device {
        Device::Cpu | Device::GpuSim => Ok(()),
        Device::GpuEmu if powerinfer_cuda::BUILT_WITH_EMU => Ok(()),
        Device::GpuEmu => bail!(
            Unsupported,
            "gpu-emu: this build has no emulator (the `emu` feature); use device=\"gpu-sim\""
        ),
        Device::Cuda(_) if !powerinfer_cuda::BUILT_WITH_CUDA => bail!(
            Cuda,
            "{device}: this build has no CUDA support; use device=\"gpu-sim\" to run the plan's \
             GPU side on the host"
        ),
        Device::Cuda(n) => {
            let count = powerinfer_cuda::device_count();
            if n >= count {
                bail!(
                    Cuda,
                    "{device} was asked for, but {count} CUDA device(s) were found (is the NVIDIA \
                     driver installed?); device=\"gpu-sim\" runs a plan's GPU side on the host"
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::Error;

    #[test]
    fn refusals_are_typed() {
        assert_eq!(check_device("cpu").unwrap(), Device::Cpu);
        assert_eq!(check_device("gpu-sim").unwrap(), Device::GpuSim);
        assert!(matches!(check_device("gpu"), Err(Error::Unsupported(_))));
        match check_device("gpu-emu") {
            Ok(d) => assert!(powerinfer_cuda::BUILT_WITH_EMU && d == Device::GpuEmu),
            Err(e) => assert!(matches!(e, Error::Unsupported(_)), "{e}"),
        }
        // No machine has a million GPUs: a CUDA error whether or not the build has CUDA.
        let e = check_device("cuda:1000000").unwrap_err();
        assert!(
            matches!(e, Error::Cuda(_)) && e.to_string().contains("cuda:1000000"),
            "{e}"
        );
    }
}
