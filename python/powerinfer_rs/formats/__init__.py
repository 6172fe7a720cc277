"""The files the stages write, each read and written by exactly one module here:

* :mod:`.thresholds` - per-layer thresholds (``calibrate`` writes, the engine and ``profile``
  read);
* :mod:`.profile` - activation counts (``profile`` writes, ``plan`` reads);
* :mod:`.samples` - (FFN input, activation mask) rows (``profile --samples`` writes,
  ``train_predictors`` reads);
* :mod:`.predictors` - ``predictors.safetensors`` (``train_predictors`` writes, the engine and
  ``evaluate`` read);
* :mod:`.plan` - ``PLAN.safetensors`` (``plan`` writes, the engine reads).

Model files (GGUF, Hugging Face, PowerInfer's) are :mod:`powerinfer_rs.loading`.
"""
