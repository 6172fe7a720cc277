//! Settings an environment variable pins, read the same way wherever they are used.

use powerinfer_core::{bail, Result};

/// The share in 0..=1 the environment variable `name` pins (a crossover), None when it is
/// unset; `Error::Plan` for anything else.
pub(crate) fn share_from_env(name: &str) -> Result<Option<f32>> {
    let Ok(v) = std::env::var(name) else {
        return Ok(None);
    };
    match v.trim().parse::<f32>() {
        Ok(c) if (0.0..=1.0).contains(&c) => Ok(Some(c)),
        _ => bail!(Plan, "{name}={v:?}: expected a share in 0..=1"),
    }
}
