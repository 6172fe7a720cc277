"""Test-file generators: :mod:`.synth` (synthetic llama models, GGUF or Hugging Face, with a
planted activation power law; "synthetic" wherever a figure comes from one) and
:mod:`.powerinfer_files` (PowerInfer GGUF files and predictor/activation directories)."""
