"""Fuzz the predictor-sample reader (``formats.samples.load_samples``).

The first byte picks the file the rest of the input becomes, the other is valid: 0 -
``samples/meta.json``; 1 - the shard ``samples/layer_000/shard_00000.npz``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, tmp_dir, write  # noqa: E402


def load():
    import numpy as np

    from powerinfer_rs.formats.samples import SampleWriter, load_samples, shard_path

    root = tmp_dir() / "prof"
    with SampleWriter(root, 1, 4, 8, shard_rows=2) as w:
        w.add(0, np.ones((3, 4), np.float32), np.eye(3, 8, dtype=bool))
    meta_path = root / "samples" / "meta.json"
    shard = shard_path(root / "samples", 0, 0)
    good_meta, good_shard = meta_path.read_bytes(), shard.read_bytes()

    def one_input(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0] % 2, data[1:]
        write(meta_path, body if mode == 0 else good_meta)
        write(shard, body if mode == 1 else good_shard)
        x, m = load_samples(root, 0)
        assert x.shape[0] == m.shape[0]

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
