//! The operands the ops hand to the kernels: the structures both [`crate::ops`] (which builds
//! them) and [`crate::kernels`] (which read them) name, so that neither imports the other.

pub(crate) mod attention;
pub(crate) mod input_major;
pub(crate) mod interleaved;
pub(crate) mod matrix;
