//! CPU kernels (placeholder until the kernel work lands).
