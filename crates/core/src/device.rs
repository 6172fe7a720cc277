//! The device an engine runs a plan's GPU side on, and the one grammar of its name. Every way
//! in (the session, the hybrid executor, the Python API through `_core.parse_device`) parses
//! here, so the names accepted and the text of a refusal are written once.
//!
//! Grammar (exact, lower case): `cpu`, `gpu-sim`, `gpu-emu`, `cuda` (= `cuda:0`) and `cuda:N`
//! (N decimal digits). Plain `gpu` is refused: three devices run a GPU plan (the simulated
//! contract, the emulated kernels and a real GPU), and the name says not which; the error
//! names them.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Where a plan's GPU side runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// No GPU: everything on the CPU engine.
    Cpu,
    /// The host backend: each kernel's contract in plain Rust, in host memory.
    GpuSim,
    /// The CUDA kernels compiled for the host and run by the emulator.
    GpuEmu,
    /// A CUDA device by ordinal.
    Cuda(usize),
}

/// The names [`Device::parse`] accepts, as the error messages list them.
pub const DEVICE_NAMES: &str = "\"cpu\", \"gpu-sim\", \"gpu-emu\", \"cuda\" or \"cuda:N\"";

impl Device {
    /// Parse a device name ([`Error::Unsupported`] for anything outside the grammar above).
    pub fn parse(name: &str) -> Result<Device> {
        match name {
            "cpu" => return Ok(Device::Cpu),
            "gpu-sim" => return Ok(Device::GpuSim),
            "gpu-emu" => return Ok(Device::GpuEmu),
            "cuda" => return Ok(Device::Cuda(0)),
            _ => {}
        }
        let digits = name.strip_prefix("cuda:").unwrap_or("");
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = digits.parse::<usize>() {
                return Ok(Device::Cuda(n));
            }
        }
        let hint = if name == "gpu" {
            ": \"gpu\" does not say which; \"cuda\" is a real GPU, \"gpu-sim\" and \"gpu-emu\" \
             run a plan's GPU side on the CPU"
        } else {
            ""
        };
        Err(Error::Unsupported(format!(
            "device {name:?}: expected {DEVICE_NAMES}{hint}"
        )))
    }

    /// The refusal of a device that is not a string at all (`what` describes it).
    pub fn not_a_name(what: &str) -> Error {
        Error::Unsupported(format!(
            "device must be a string ({DEVICE_NAMES}), got {what}"
        ))
    }

    /// The kind without the ordinal: "cpu", "gpu-sim", "gpu-emu" or "cuda".
    pub fn kind(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::GpuSim => "gpu-sim",
            Device::GpuEmu => "gpu-emu",
            Device::Cuda(_) => "cuda",
        }
    }

    /// The CUDA ordinal, for a CUDA device.
    pub fn index(self) -> Option<usize> {
        match self {
            Device::Cuda(n) => Some(n),
            _ => None,
        }
    }

    /// Whether the device runs a plan's GPU side (every device but the CPU).
    pub fn is_gpu(self) -> bool {
        self != Device::Cpu
    }
}

impl fmt::Display for Device {
    /// The canonical name: "cpu", "gpu-sim", "gpu-emu" or "cuda:N" ("cuda" is "cuda:0").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            d => f.write_str(d.kind()),
        }
    }
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Device> {
        Device::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        for (name, want) in [
            ("cpu", Device::Cpu),
            ("gpu-sim", Device::GpuSim),
            ("gpu-emu", Device::GpuEmu),
            ("cuda", Device::Cuda(0)),
            ("cuda:0", Device::Cuda(0)),
            ("cuda:12", Device::Cuda(12)),
            ("cuda:007", Device::Cuda(7)),
        ] {
            assert_eq!(Device::parse(name).unwrap(), want, "{name}");
        }
        for bad in [
            "",
            "gpu",
            "GPU",
            "CUDA",
            "Cuda:1",
            " cuda",
            "cuda ",
            "cuda:",
            "cuda:-1",
            "cuda:+1",
            "cuda:x",
            "cuda:1.0",
            "cuda:٣",
            "cuda:1:2",
            "cpu:0",
            "gpu-sim:0",
            "tpu",
            "cuda:99999999999999999999999",
        ] {
            let e = Device::parse(bad).unwrap_err();
            assert!(matches!(e, Error::Unsupported(_)), "{bad:?}: {e}");
            assert!(e.to_string().contains(DEVICE_NAMES), "{e}");
        }
        assert!(Device::parse("gpu")
            .unwrap_err()
            .to_string()
            .contains("does not say which"));
    }

    #[test]
    fn canonical_names_parse_back() {
        for d in [Device::Cpu, Device::GpuSim, Device::GpuEmu, Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
            assert_eq!(d.is_gpu(), d != Device::Cpu);
        }
        assert_eq!(Device::Cuda(0).to_string(), "cuda:0");
        assert_eq!(
            (Device::Cuda(2).kind(), Device::Cuda(2).index()),
            ("cuda", Some(2))
        );
        assert_eq!(Device::GpuSim.index(), None);
    }
}
