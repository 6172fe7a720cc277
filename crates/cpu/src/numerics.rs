//! Which quantized activations the quantized products take on the x86 levels, chosen once per
//! process ([`numerics`]): the int16 x (`kernels::avx2::int16`, the default) or the int8 x in
//! blocks of 32 with a scale per 16 values (`kernels::avx2::int8`, opt-in while its row kernels
//! are brought to the memory floor; see `benchmarks/accuracy_vs_reference.py` for how each
//! scores against a float64 reference). The scalar level always takes f32 x. Some formats
//! take the int8 x whatever the numerics ([`int8_always`]).

use powerinfer_core::DType;
use std::sync::OnceLock;

/// Whether products of `dtype` rows take the int8 x whatever the numerics: the low-bit formats
/// (no int16-x kernel) and the lattice formats with a fused int8-x kernel
/// (`kernels::avx2::lattice_x8`: IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), faster than their int16-x one.
pub(crate) fn int8_always(dtype: DType) -> bool {
    dtype.is_lowbit()
        || matches!(
            dtype,
            DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S | DType::IQ1_M
        )
}

/// The environment variable that selects the activations: `int16` (the default) or `int8`.
pub const NUMERICS_ENV: &str = "POWERINFER_RS_NUMERICS";

/// The quantized products' activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numerics {
    /// x as int16 per 32-block (two byte dots per 32 weights).
    Int16,
    /// x as int8 per 32-block, a scale per 16 values (one byte dot per 32 weights).
    Int8,
}

impl Numerics {
    /// Its name, as [`NUMERICS_ENV`] takes it.
    pub const fn name(self) -> &'static str {
        match self {
            Numerics::Int16 => "int16",
            Numerics::Int8 => "int8",
        }
    }
}

/// The process's numerics: [`NUMERICS_ENV`] read once (an unknown value keeps the default and
/// says so on stderr).
pub fn numerics() -> Numerics {
    static CHOSEN: OnceLock<Numerics> = OnceLock::new();
    *CHOSEN.get_or_init(|| match std::env::var(NUMERICS_ENV).as_deref() {
        Ok("int8") => Numerics::Int8,
        Ok("int16") | Ok("") | Err(_) => Numerics::Int16,
        Ok(other) => {
            eprintln!("powerinfer_rs: {NUMERICS_ENV}={other:?} is not int16 or int8: int16");
            Numerics::Int16
        }
    })
}
