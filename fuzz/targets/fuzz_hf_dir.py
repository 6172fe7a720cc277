"""Fuzz the Hugging Face model directory reader (``loading.hf_loader.load_hf_dir``): its JSON
files around a valid tiny model.

The first byte picks the file the rest of the input becomes, the others are valid: 0 -
``config.json``; 1 - ``tokenizer_config.json``; 2 - ``generation_config.json``; 3 -
``model.safetensors.index.json`` (beside the single ``model.safetensors``); 4 -
``tokenizer.json`` (parsed by the ``tokenizers`` library)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, tmp_dir, write  # noqa: E402

FILES = (
    "config.json",
    "tokenizer_config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
)


def load():
    from powerinfer_rs.loading.hf_loader import load_hf_dir
    from powerinfer_rs.testing.synth import write_hf_model

    d = tmp_dir() / "hf"
    write_hf_model(d, dtype="f32", dim=16, ffn=32, layers=1, heads=2, kv_heads=1, vocab=260)
    good = {name: (d / name).read_bytes() if (d / name).is_file() else None for name in FILES}

    def one_input(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0] % len(FILES), data[1:]
        for i, name in enumerate(FILES):
            content = body if i == mode else good[name]
            if content is None:
                (d / name).unlink(missing_ok=True)
            else:
                write(d / name, content)
        load_hf_dir(d)

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
