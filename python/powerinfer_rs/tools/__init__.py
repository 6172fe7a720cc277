"""Helpers of the command-line tools (``calibrate``, ``profile``, ``evaluate``) and the
benchmarks: corpus text extraction, running the engine over token windows, CLI plumbing."""
