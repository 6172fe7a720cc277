"""Fuzz the neuron store's opening through the Python API (``Engine.use_neuron_store``: the
file's type, its header against the file's size and the model, the cache and the reader
threads), then one decode step through it when it opens.

The first byte picks what the rest of the input is (``harness.store_engine`` writes the valid
store): even - the store's first bytes (the rest of the valid file after them: header fields
and hash under test, the clusters intact); odd - the whole file. A `ModelFileError` is the
answer to a damaged file; a store that opens must decode finite logits."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, store_engine, tmp_dir, write  # noqa: E402


def load():
    import numpy as np

    from powerinfer_rs.errors import ModelFileError, PowerInferError

    eng, valid = store_engine(tmp_dir())
    path = tmp_dir() / "fuzzed.neurons"

    def one_input(data: bytes) -> None:
        if not data:
            return
        body = data[1:]
        if data[0] % 2 == 0:
            body = body[: len(valid)] + valid[len(body) :]
        write(path, body)
        try:
            eng.use_neuron_store(path, cache=1 << 20, io_threads=2)
        except ModelFileError:
            return
        try:
            eng.reset()
            # Rows are not checked when read: damaged ones may give non-finite logits, which
            # the engine refuses as a typed error, never returns.
            assert np.isfinite(eng.prefill([5, 17])).all()
        except PowerInferError:
            pass
        finally:
            eng.close_neuron_store()

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
