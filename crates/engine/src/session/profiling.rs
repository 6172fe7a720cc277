//! A session's activation profile: started, read and stopped between forward passes (the
//! offline profiler and the input mode's calibration drive it).

use powerinfer_core::Result;

use super::Session;
use crate::profiler::{Captured, Profiler};

impl Session {
    /// Start counting activations (ReLU semantics when `thresholds` is None, |act| >= t
    /// otherwise), keeping (FFN input, activation) rows when `capture`. Replaces any running
    /// profile.
    pub fn start_profiling(&mut self, thresholds: Option<Vec<f32>>, capture: bool) -> Result<()> {
        let c = &self.model.config;
        if let Some(t) = &thresholds {
            powerinfer_core::ensure!(
                t.len() == c.n_layers,
                Plan,
                "{} thresholds for a {}-layer model",
                t.len(),
                c.n_layers
            );
        }
        c.refuse_non_flat("profiling")?;
        self.profiler = Some(Profiler::for_model(c, thresholds, capture));
        Ok(())
    }

    /// Keep the input mode's site rows in the running profile from now on (calibration of the
    /// input mode; see [`Profiler::record_site`]). Plan error when not profiling.
    pub fn capture_sites(&mut self) -> Result<()> {
        match self.profiler.as_mut() {
            Some(p) => {
                p.capture_sites = true;
                Ok(())
            }
            None => powerinfer_core::bail!(Plan, "not profiling"),
        }
    }

    /// The site rows captured since the last call (per layer four, then the output head's).
    pub fn take_sites(&mut self) -> (Vec<[Vec<f32>; 4]>, Vec<f32>) {
        self.profiler
            .as_mut()
            .map(Profiler::take_sites)
            .unwrap_or_default()
    }

    /// Stop profiling and return what was counted.
    pub fn stop_profiling(&mut self) -> Option<Profiler> {
        self.profiler.take()
    }

    /// The running profile, if any.
    pub fn profiler(&self) -> Option<&Profiler> {
        self.profiler.as_ref()
    }

    /// Captured rows since the last call (empty when not capturing).
    pub fn take_captured(&mut self) -> Vec<Captured> {
        self.profiler
            .as_mut()
            .map(Profiler::take_captured)
            .unwrap_or_default()
    }
}
