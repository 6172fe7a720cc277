"""Fuzz the prepared-directory reader (``runtime.prepared.read_prepared``: ``prepared.json``,
its types, every file against its digest; ``Prepared.check_model``; and the auto-fit's reuse
check ``runtime.autofit.reusable``, which must answer "prepare again, because ..." to any
damage, never raise).

The first byte picks the file the rest of the input becomes, the others are valid
(``harness.prepared_dir``): 0 - ``prepared.json``; 1 - ``thresholds.json`` (its digest then
mismatches unless the bytes are the same); 2 - the model file (``check_model`` hashes it)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import (  # noqa: E402
    PREPARED_FILES,
    PREPARED_MODEL,
    fuzz_main,
    prepared_dir,
    tmp_dir,
    write,
)


def load():
    import json

    from powerinfer_rs.runtime.autofit import reusable
    from powerinfer_rs.runtime.prepared import MANIFEST, read_prepared

    d, model, manifest = prepared_dir(tmp_dir())
    good = json.dumps(manifest).encode()
    thresholds = d / "thresholds.json"

    def one_input(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0] % 3, data[1:]
        write(d / MANIFEST, body if mode == 0 else good)
        write(thresholds, body if mode == 1 else PREPARED_FILES["thresholds.json"])
        write(model, body if mode == 2 else PREPARED_MODEL)
        done, why = reusable(d, manifest["key"], str(model))  # never raises
        assert (done is None) != (why is None) and (why is None or isinstance(why, str))
        p = read_prepared(d)  # a PlanError for any damage
        assert p is not None and p.sparsity in ("threshold", "predictor", "exact-relu")
        p.check_model(model)
        if done is not None:
            assert (done.sparsity, done.model) == (p.sparsity, str(model))

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
