//! Whether the whole-matrix products' matrices are interleaved at load ([`interleaving`]):
//! on by default; `POWERINFER_RS_LAYOUT=rows` keeps every matrix in the file's rows (for A/B
//! measurements against the row-major kernels, and as a way out should a layout misbehave).

use std::sync::OnceLock;

/// The environment variable that selects the layout: `interleaved` (the default) or `rows`.
pub const LAYOUT_ENV: &str = "POWERINFER_RS_LAYOUT";

/// Whether [`Matrix::for_products`](crate::Matrix::for_products) interleaves: [`LAYOUT_ENV`]
/// read once (an unknown value keeps the default and says so on stderr).
pub fn interleaving() -> bool {
    static CHOSEN: OnceLock<bool> = OnceLock::new();
    *CHOSEN.get_or_init(|| match std::env::var(LAYOUT_ENV).as_deref() {
        Ok("rows") => false,
        Ok("interleaved") | Ok("") | Err(_) => true,
        Ok(other) => {
            eprintln!(
                "powerinfer_rs: {LAYOUT_ENV}={other:?} is not interleaved or rows: interleaved"
            );
            true
        }
    })
}
