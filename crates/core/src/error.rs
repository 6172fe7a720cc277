//! The one error type of the Rust side, with `bail!`/`ensure!` helpers. Each variant maps to one
//! Python exception class, which the bindings crate creates (see [`Error::class_name`]).

use thiserror::Error as ThisError;

/// Everything that can go wrong below Python.
#[derive(Debug, ThisError)]
pub enum Error {
    /// A tensor or buffer whose size or shape does not fit what it claims to be.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A weight format or model feature the engine does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A model file (or the tensors it describes) is malformed.
    #[error("bad model file: {0}")]
    ModelFile(String),
    /// A token id outside the vocabulary.
    #[error("token id out of range: {0}")]
    Token(String),
    /// More tokens than the context window holds.
    #[error("context overflow: {0}")]
    ContextOverflow(String),
    /// A plan or neuron table that does not fit the model it is used with.
    #[error("plan mismatch: {0}")]
    Plan(String),
    /// A placement whose device bytes exceed the VRAM budget it must fit.
    #[error("VRAM budget exceeded: {0}")]
    VramBudget(String),
    /// A model asked for by hub id that cannot be resolved: no file for the tag, two files for
    /// it, offline without a cached copy, a missing or gated repo. (Raised from Python; declared
    /// here so every class lives in one place.)
    #[error("hub: {0}")]
    Hub(String),
    /// A CUDA driver, NVRTC or kernel launch error, or no GPU where one was asked for.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The caller asked to stop (Ctrl-C) between two chunks of work.
    #[error("interrupted")]
    Interrupted,
    /// Anything else (a bug, a failed thread pool, ...), with context.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// The name of the Python exception class this error is raised as (every class derives
    /// from `PowerInferError`; `Interrupted` becomes `KeyboardInterrupt` in the bindings).
    pub fn class_name(&self) -> &'static str {
        match self {
            Error::Shape(_) => "ShapeError",
            Error::Unsupported(_) => "UnsupportedError",
            Error::ModelFile(_) => "ModelFileError",
            Error::Token(_) => "TokenError",
            Error::ContextOverflow(_) => "ContextOverflowError",
            Error::Plan(_) => "PlanError",
            Error::VramBudget(_) => "VramBudgetError",
            Error::Hub(_) => "HubError",
            Error::Cuda(_) => "CudaError",
            Error::Interrupted | Error::Other(_) => "InternalError",
        }
    }
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Return early with an error variant built from a format string:
/// `bail!(Shape, "rows {} != {}", a, b)`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::Error::$kind(format!($($arg)*)))
    };
}

/// `ensure!(cond, Kind, "message {}", x)`: bail with that error unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $kind:ident, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($kind, $($arg)*);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(n: usize) -> Result<usize> {
        ensure!(n < 4, Shape, "n = {n} is not < 4");
        Ok(n)
    }

    #[test]
    fn ensure_returns_the_named_variant() {
        assert_eq!(check(3).unwrap(), 3);
        let err = check(5).unwrap_err();
        assert!(matches!(err, Error::Shape(_)));
        assert_eq!(err.to_string(), "shape mismatch: n = 5 is not < 4");
    }
}
