"""Paths, files and sizes the Python API hands to Rust: a path is decoded as ``os.fsencode``
decodes it (str, bytes, ``os.PathLike``; surrogate-escaped bytes) or refused with a typed error
naming the argument, never a Rust panic; a file the engine reads must be a regular file (a FIFO
is refused at once, never waited on); sizes past the machine's memory and reader counts past
the engine's bound are refused before anything is allocated or started; and every single-bit
change of a neuron store's header is refused (issue 57)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, PlanError, PowerInferError, ShapeError
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime.neuron_store import MAX_IO_THREADS

SHAPE = dict(dim=64, ffn=160, layers=3, heads=4, kv_heads=2, vocab=300)
#: A str no file system encoding holds (a lone high surrogate: not surrogate-escaped bytes).
BAD = "bad-\ud800.bin"


@pytest.fixture(scope="module")
def model_path(synth_gguf):
    return synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE)


@pytest.fixture(scope="module")
def eng(model_path):
    return Engine(load_model(model_path), threads=2, sparsity="exact-relu")


@pytest.fixture(scope="module")
def store(eng, tmp_path_factory):
    return eng.write_neuron_store(tmp_path_factory.mktemp("store") / "m.neurons", cluster=8)


def test_a_path_the_file_system_cannot_encode_is_a_typed_error(eng, tmp_path):
    dense = Engine(eng.loaded, threads=1)  # its transposed rows not built yet
    calls = {
        "use_neuron_store": lambda p: eng.use_neuron_store(p),
        "use_down_t_file": lambda p: dense.use_down_t_file(p),
        "write_neuron_store": lambda p: eng.write_neuron_store(p),
        "gpu_allocation_report": lambda p: eng.gpu_allocation_report(p),
        "Engine(plan=)": lambda p: Engine(eng.loaded, plan=p, device="gpu-sim"),
        "thresholds": lambda p: dense.set_sparsity("threshold", thresholds=p),
        "predictors": lambda p: dense.set_sparsity("predictor", predictors=p),
    }
    for name, call in calls.items():
        for p in (BAD, str(tmp_path / BAD)):
            with pytest.raises(PowerInferError, match="cannot be encoded") as e:
                call(p)
            assert isinstance(e.value, ValueError), name
            want = PlanError if "plan" in name or "allocation" in name else ModelFileError
            assert isinstance(e.value, want), (name, type(e.value))
    with pytest.raises(TypeError):
        eng.use_neuron_store(3.5)


def test_paths_are_decoded_as_os_fsencode_decodes_them(eng, store, tmp_path):
    # bytes, a PathLike, and a str holding surrogate-escaped bytes (a file name that is not
    # UTF-8, as os.listdir returns it) all name the same kind of file.
    raw = os.fsencode(tmp_path) + b"/not-utf8-\xff.neurons"
    written = eng.write_neuron_store(raw, cluster=8)
    assert os.path.getsize(raw) == os.path.getsize(store)
    escaped = os.fsdecode(raw)
    assert "\udcff" in escaped
    info = eng.use_neuron_store(escaped)
    assert info["file_bytes"] == os.path.getsize(store)
    eng.close_neuron_store()
    info = eng.use_neuron_store(written)
    eng.close_neuron_store()
    assert info["cluster"] == 8


def test_a_fifo_is_refused_at_once_not_waited_on(model_path, tmp_path):
    # In a child process with a deadline: a regression would hang forever in open(2).
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = textwrap.dedent(
        f"""
        from powerinfer_rs import Engine
        from powerinfer_rs.errors import ModelFileError, PlanError
        from powerinfer_rs.loading import load_model
        eng = Engine(load_model({str(model_path)!r}), threads=1, sparsity="exact-relu")
        # Dense: its transposed rows are not built yet, so use_down_t_file reads the path.
        dense = Engine(load_model({str(model_path)!r}), threads=1)
        fifo = {str(fifo)!r}
        for name, call, cls in [
            ("use_neuron_store", lambda: eng.use_neuron_store(fifo), ModelFileError),
            ("use_down_t_file", lambda: dense.use_down_t_file(fifo), ModelFileError),
            ("write_neuron_store", lambda: eng.write_neuron_store(fifo), ModelFileError),
            ("plan", lambda: Engine(eng.loaded, plan=fifo, device="gpu-sim"), PlanError),
            # The Python readers make the same check.
            ("thresholds", lambda: dense.set_sparsity("threshold", thresholds=fifo),
             ModelFileError),
            ("predictors", lambda: dense.set_sparsity("predictor", predictors=fifo),
             ModelFileError),
            ("input thresholds", lambda: dense.set_sparsity("input", thresholds=fifo),
             ModelFileError),
        ]:
            try:
                call()
            except cls as e:
                assert "not a regular file (a FIFO)" in str(e), (name, e)
                print(name, "refused")
            else:
                raise SystemExit(name + " took a FIFO")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("refused") == 7, out.stdout
    assert fifo.is_fifo()  # never replaced by a file


def test_a_directory_is_no_store_and_is_never_replaced(eng, model_path, tmp_path):
    with pytest.raises(ModelFileError, match="directory"):
        eng.use_neuron_store(tmp_path)
    with pytest.raises(ModelFileError, match="directory"):
        eng.write_neuron_store(tmp_path)
    with pytest.raises(ModelFileError, match="directory"):
        Engine(load_model(model_path), threads=1).use_down_t_file(tmp_path)
    assert tmp_path.is_dir()


def test_sizes_past_the_machine_and_reader_counts_past_the_bound_are_refused(eng, store):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for cache in ("1TiB", 1 << 50, physical + 1, 1 << 70, "1e30GiB"):
        with pytest.raises(ShapeError, match="more than this machine"):
            eng.use_neuron_store(store, cache=cache)
    for n in (MAX_IO_THREADS + 1, 100_000):
        with pytest.raises(ShapeError, match=f"1..{MAX_IO_THREADS}"):
            eng.use_neuron_store(store, io_threads=n)
    # The bound is the engine's too, not only the Python front's.
    with pytest.raises(ShapeError, match="reader threads"):
        eng.core_model.open_neuron_store(os.fspath(store), 1 << 20, 100_000, None, False)
    # The process is alive and the store still opens.
    assert eng.use_neuron_store(store, io_threads=2)["cluster"] == 8
    eng.close_neuron_store()


def test_every_single_bit_flip_of_a_store_header_is_refused(eng, store, tmp_path):
    data = store.read_bytes()
    # The header's fields: magic, version, layers, dim, neurons, cluster, the fingerprint's
    # length and bytes, three formats per layer, the hash; then some of its zero padding.
    fp_len = int.from_bytes(data[40:44], "little")
    end = 44 + fp_len + 3 * SHAPE["layers"] + 8 + 16
    flipped = tmp_path / "flipped.neurons"
    accepted = []
    for bit in range(8 * end):
        b = bytearray(data)
        b[bit // 8] ^= 1 << (bit % 8)
        flipped.write_bytes(bytes(b))
        try:
            eng.use_neuron_store(flipped)
        except ModelFileError:
            continue
        eng.close_neuron_store()
        accepted.append(bit)
    assert not accepted, f"{len(accepted)} of {8 * end} flips accepted: bits {accepted[:20]}"
    # The file itself opens.
    assert eng.use_neuron_store(store)["file_bytes"] == len(data)
    eng.close_neuron_store()


def test_a_vram_budget_past_any_gpu_is_a_plan_error(synth_gguf, tmp_path):
    from test_engine_plan import TINY, plan_file

    model = load_model(synth_gguf(dtype="Q8_0", **TINY))
    _, plan = plan_file(model, tmp_path, 1 << 20, "p.safetensors")
    for budget in ("1e30GiB", 1 << 70, "1e30"):
        with pytest.raises(PlanError, match="more than any GPU holds"):
            Engine(model, threads=1, plan=plan, device="gpu-sim", vram_budget=budget)
