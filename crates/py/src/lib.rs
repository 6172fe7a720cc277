//! Bindings (placeholder).
