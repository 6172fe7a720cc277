"""The neuron store (models bigger than RAM, PowerInfer-2's neuron cache): a model's FFN neurons
written by cluster to a sidecar file, read back through a cache of fixed size by a pool of
reader threads. Decoding through it gives the all-resident engine's logits in the same mode
(exact-relu, predictor), with a cache far smaller than the file (the eviction path runs every
token) and with one that holds it all (a second pass reads nothing). Bad files, caches and reads
are typed errors, never a hang. No cgroups here: the memory-limited figures are
benchmarks/bench_neuron_store.py's."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_hybrid import assert_close, assert_same_decode, greedy
from test_moe import MOE_ARCHS
from test_sparsity import random_predictors

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError, ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model

SHAPE = dict(dim=64, ffn=160, layers=3, heads=4, kv_heads=2, vocab=300)
PROMPT = [5, 17, 123, 42, 7]
STEPS = 8
#: The store's products run one cluster at a time (partial sums in cluster order), the
#: resident one over the layer: the same rows and kernels, another summation order.
TOL = 1e-4
#: Q4_0's down pass rounds its coefficients to 8 bits per block and group of 8 rows
#: (powerinfer_cpu::axpy_rows), and the groups follow the rows each call is given: one cluster
#: here, the layer's active list there. Measured: 7e-4 of the largest logit at the first step,
#: 3e-3 after eight (the difference carried by the KV cache).
TOL_Q4 = 5e-3
#: A mixture of experts' dense experts through the store: Q8_0's down rows re-encoded after
#: the transpose (the resident engine reads the file's).
TOL_MOE_Q8 = 5e-3


def engines(model, mode: str):
    kw: dict = {"threads": 2, "sparsity": mode}
    if mode == "predictor":
        kw["predictors"] = random_predictors(model, rank=16, seed=2)
    return Engine(model, **kw), Engine(model, **kw)


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_0", "IQ4_NL", "MXFP4"])
@pytest.mark.parametrize("mode", ["exact-relu", "predictor"])
def test_the_store_decodes_as_the_resident_engine(synth_gguf, tmp_path, dtype, mode):
    model = load_model(synth_gguf(dtype=dtype, activation="relu", seed=3, **SHAPE))
    resident, stored = engines(model, mode)
    path = stored.write_neuron_store(tmp_path / "model.neurons", cluster=4)
    clusters = -(-SHAPE["ffn"] // 4)
    # A cache of three clusters against 40 per layer: nearly every cluster is read again.
    size = os.path.getsize(path)
    per_cluster = (size - 4096) // (SHAPE["layers"] * clusters)
    info = stored.use_neuron_store(path, cache=3 * per_cluster, io_threads=3)
    assert info["cache_slots"] == 3 and info["cluster"] == 4 and info["file_bytes"] == size
    tol = TOL_Q4 if dtype == "Q4_0" else TOL
    want = assert_same_decode(resident, stored, PROMPT, STEPS, tol, f"{dtype} {mode}")
    s = stored.neuron_store_stats(reset=True)
    assert s["misses"] > 0 and s["misses"] > 3 * s["hits"], s
    if mode == "predictor":  # whole clusters; exact-relu reads their up and down_t rows
        assert s["bytes_read"] == s["misses"] * per_cluster
    assert s["bytes_read"] % 4096 == 0 and s["bytes_read"] > 0
    # A cache of the whole file: a second pass over the same tokens reads nothing.
    stored.use_neuron_store(path, cache=size, io_threads=2)
    greedy(stored, PROMPT, STEPS)
    stored.neuron_store_stats(reset=True)
    again, _ = greedy(stored, PROMPT, STEPS)
    s = stored.neuron_store_stats()
    assert s["misses"] == 0 and s["hits"] > 0 and s["hit_rate"] == 1.0
    for g, w in zip(again, want):
        assert_close(g, w, tol, f"{dtype} {mode} cached")
    # Closed: the resident rows again, no counts.
    stored.close_neuron_store()
    assert stored.neuron_store_stats() == {}
    np.testing.assert_allclose(greedy(stored, PROMPT, 2)[0][-1], want[2], rtol=0, atol=1e-5)


def test_a_store_in_use_needs_no_transposed_copy(synth_gguf, tmp_path):
    """An engine that attaches its store before it enters exact-relu or predictor mode builds no
    transposed down projection in memory (the store holds those rows): what lets it run in a
    memory limit its resident copy would exceed."""
    model = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))
    path = Engine(model).write_neuron_store(tmp_path / "m.neurons")
    eng = Engine(model, threads=2)
    eng.use_neuron_store(path, cache="1MiB")
    eng.set_sparsity("exact-relu")
    assert eng.core_model.down_t_bytes == 0
    want, _ = greedy(Engine(model, threads=2, sparsity="exact-relu"), PROMPT, 4)
    got, _ = greedy(eng, PROMPT, 4)
    for g, w in zip(got, want):
        assert_close(g, w, TOL, "no copy")
    assert eng.core_model.down_t_bytes == 0 and eng.neuron_store_stats()["misses"] > 0


def test_bad_stores_caches_and_reads_are_typed_errors(synth_gguf, tmp_path):
    model = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))
    eng = Engine(model, threads=2, sparsity="exact-relu")
    path = eng.write_neuron_store(tmp_path / "a.neurons", cluster=8)
    data = path.read_bytes()
    junk = tmp_path / "junk.neurons"
    junk.write_bytes(os.urandom(8192))
    with pytest.raises(ModelFileError, match="not a neuron store"):
        eng.use_neuron_store(junk)
    cut = tmp_path / "cut.neurons"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="cut to"):
        eng.use_neuron_store(cut)
    with pytest.raises(ModelFileError):
        eng.use_neuron_store(tmp_path / "missing.neurons")
    # Another model's store (another seed: another fingerprint; another width: another shape).
    other = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=4, **SHAPE))
    with pytest.raises(ModelFileError, match="written for model"):
        Engine(other, sparsity="exact-relu").use_neuron_store(path)
    wide = load_model(synth_gguf(dtype="Q8_0", activation="relu", **{**SHAPE, "ffn": 192}))
    with pytest.raises(ModelFileError, match="another model shape"):
        Engine(wide, sparsity="exact-relu").use_neuron_store(path)
    with pytest.raises(ShapeError, match="holds no cluster"):
        eng.use_neuron_store(path, cache=4096)
    with pytest.raises(ShapeError):
        eng.use_neuron_store(path, io_threads=0)
    with pytest.raises(ShapeError):
        eng.write_neuron_store(tmp_path / "b.neurons", cluster=0)
    # The file shrinks under an open store: the next read fails as a typed error, and nothing
    # stays pinned (reads in flight are waited for, failed slots forgotten): with the file whole
    # again the same store, three clusters of cache, decodes as the resident engine.
    per_cluster = (len(data) - 4096) // (SHAPE["layers"] * -(-SHAPE["ffn"] // 8))
    eng.use_neuron_store(path, cache=3 * per_cluster, io_threads=3)
    eng.prefill(PROMPT)
    with open(path, "r+b") as f:
        f.truncate(8192)
    with pytest.raises(ModelFileError, match="reading"):
        eng.prefill([9])
    path.write_bytes(data)
    eng.reset()
    want, _ = greedy(Engine(model, threads=2, sparsity="exact-relu"), PROMPT, 4)
    got, _ = greedy(eng, PROMPT, 4)
    for g, w in zip(got, want):
        assert_close(g, w, TOL, "after a failed read")
    eng.close_neuron_store()
    eng.reset()
    assert np.isfinite(eng.prefill(PROMPT)).all()


@pytest.mark.parametrize(
    "arch,mode,dtype",
    [
        ("qwen3moe", "dense", "F32"),
        ("qwen2moe", "dense", "F32"),
        ("smallthinker", "exact-relu", "F32"),
        ("qwen3moe", "dense", "Q8_0"),
    ],
)
def test_a_mixture_of_experts_decodes_from_its_store(synth_gguf, tmp_path, arch, mode, dtype):
    """A mixture of experts' store holds its routed experts' neurons: a decoded token reads its
    routed experts from it (dense: whole clusters; exact-relu inside ReGLU experts: the up and
    down_t rows of the neurons that fire, gates from the mapped rows), the shared expert from
    the mapped weights, and gives the resident engine's logits, with a cache of a few clusters
    (evicting every token) and with hot clusters from a profile's counts (routed neurons, then
    the shared expert's). Quantized dense experts read the store's transposed down rows,
    re-encoded in their format, where the resident engine reads the file's: close, not equal."""
    act = "relu" if arch == "smallthinker" else "silu"
    kw = {**MOE_ARCHS[arch], "active": 0.2} if act == "relu" else MOE_ARCHS[arch]
    model = load_model(synth_gguf(dtype=dtype, activation=act, arch=arch, **kw))
    tol = TOL if dtype == "F32" else TOL_MOE_Q8
    c = model.config
    resident = Engine(model, threads=2, sparsity=mode)
    stored = Engine(model, threads=2)
    path = Engine(model).write_neuron_store(tmp_path / "moe.neurons", cluster=4)
    neurons = c.n_expert * (c.expert_ffn_dim or c.ffn_dim)
    per_cluster = (os.path.getsize(path) - 4096) // (c.n_layers * neurons // 4)
    stored.use_neuron_store(path, cache=6 * per_cluster, io_threads=3)
    stored.set_sparsity(mode)  # after the store: no transposed experts built
    want = assert_same_decode(resident, stored, PROMPT, STEPS, tol, f"{arch} {mode} {dtype}")
    s = stored.neuron_store_stats()
    assert s["misses"] > 0 and s["bytes_read"] > 0, s
    assert stored.core_model.down_t_bytes == 0  # no transposed experts in memory
    if mode == "dense":  # every routed expert's clusters, whole
        assert s["bytes_read"] == s["misses"] * per_cluster
    # Hot clusters from counts over the profile's neurons (the shared expert's last).
    counts = [np.arange(c.n_neurons)[::-1].copy() for _ in range(c.n_layers)]
    info = stored.use_neuron_store(path, cache=40 * per_cluster, hot=counts)
    assert info["resident_slots"] == 20
    got, _ = greedy(stored, PROMPT, STEPS)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, tol, f"{arch} {mode} {dtype} hot step {i}")
    assert stored.neuron_store_stats()["hits"] > 0


def test_hot_clusters_stay_resident(synth_gguf, tmp_path):
    """With a profile's counts the hottest clusters are loaded at once and never evicted: the
    first decoded token already hits them, the logits stay the resident engine's, and counts of
    another shape are refused."""
    from powerinfer_rs.runtime.neuron_store import hot_clusters

    model = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))
    resident, stored = engines(model, "exact-relu")
    resident.start_profiling()
    resident.prefill([int(t) for t in np.random.default_rng(0).integers(3, 300, 48)])
    counts, _tokens = resident.profile_counts()
    resident.stop_profiling()
    resident.reset()
    path = stored.write_neuron_store(tmp_path / "m.neurons", cluster=4)
    per_cluster = (os.path.getsize(path) - 4096) // (SHAPE["layers"] * 40)
    info = stored.use_neuron_store(path, cache=20 * per_cluster, hot=counts, resident_share=0.5)
    assert info["cache_slots"] == 20 and info["resident_slots"] == 10
    assert info["misses"] == 0  # the resident load is not counted
    want, _ = greedy(resident, PROMPT, STEPS)
    got, _ = greedy(stored, PROMPT, STEPS)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, TOL, f"resident step {i}")
    s = stored.neuron_store_stats()
    assert s["hits"] > 0 and s["resident_slots"] == 10
    # The ten hottest clusters by summed counts, over all layers.
    chosen = hot_clusters(counts, 4, 10)
    per = [np.pad(c, (0, 0)).reshape(-1, 4).sum(axis=1) for c in counts]
    cut = sorted((v for p in per for v in p), reverse=True)[9]
    assert all(per[layer][k] >= cut for layer, ks in enumerate(chosen) for k in ks)
    assert sum(len(k) for k in chosen) == 10
    with pytest.raises(ShapeError, match="hot counts"):
        stored.use_neuron_store(path, cache=20 * per_cluster, hot=counts[:1])
    with pytest.raises(ShapeError, match="resident_share"):
        stored.use_neuron_store(path, hot=counts, resident_share=1.0)


def test_read_ahead_changes_what_is_cached_not_the_logits(synth_gguf, tmp_path):
    """With read_ahead=True (off by default), predictor mode reads the clusters the next
    layer's predictor names (on this layer's input) while this layer computes: with read-ahead
    on and off the logits are the resident
    engine's, reads ahead happen only when on, and some are used by their layer (hits). A
    read-ahead whose reads fail is landed, forgotten and read again by its layer: the file cut
    under the store fails that layer's own read with a typed error, and restored it decodes as
    before."""
    model = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))
    resident, _ = engines(model, "predictor")
    want, want_toks = greedy(resident, PROMPT, STEPS)
    path = resident.write_neuron_store(tmp_path / "m.neurons", cluster=2)
    data = path.read_bytes()
    per_cluster = (len(data) - 4096) // (SHAPE["layers"] * SHAPE["ffn"] // 2)
    stats = {}
    for on in (True, False):
        _, stored = engines(model, "predictor")
        # 200 slots for 240 clusters: a layer's clusters are pinned at once, room to read ahead.
        stored.use_neuron_store(path, cache=200 * per_cluster, io_threads=3, read_ahead=on)
        got, got_toks = greedy(stored, PROMPT, STEPS)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, TOL, f"read_ahead={on} step {i}")
        assert got_toks == want_toks
        stats[on] = s = stored.neuron_store_stats()
        assert s["read_ahead"] is on
        assert s["bytes_read"] == (s["misses"] + s["ahead"]) * per_cluster, s
    assert stats[False]["ahead"] == 0 and stats[False]["ahead_used"] == 0
    assert 0 < stats[True]["ahead_used"] <= stats[True]["ahead"], stats[True]
    assert stats[True]["misses"] < stats[False]["misses"], stats
    # Reads ahead into a cut file: the layer's own read of a lost cluster is the typed error.
    _, eng = engines(model, "predictor")
    eng.use_neuron_store(path, cache=200 * per_cluster, io_threads=3, read_ahead=True)
    eng.prefill(PROMPT)
    with open(path, "r+b") as f:
        f.truncate(8192)
    with pytest.raises(ModelFileError, match="reading"):
        for t in range(STEPS):
            eng.prefill([9 + t])
    path.write_bytes(data)
    eng.reset()
    got, _ = greedy(eng, PROMPT, 4)
    for g, w in zip(got, want):
        assert_close(g, w, TOL, "after failed reads ahead")


def test_transposed_down_rows_from_a_mapped_file(synth_gguf, tmp_path):
    """The memory-mapped engine under a memory limit: the transposed down rows the sparse modes
    read come from a file (written once, reused while it is this model's, rewritten otherwise),
    not an in-memory copy; the logits are the copy's, bit for bit."""
    model = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE))
    path = tmp_path / "m.down_t"
    eng = Engine(model, threads=2)
    assert eng.use_down_t_file(path) is True
    eng.set_sparsity("exact-relu")
    assert eng.core_model.down_t_bytes == 0 and str(eng.core_model.down_t_file) == str(path)
    copy = Engine(model, threads=2, sparsity="exact-relu")
    want, want_toks = greedy(copy, PROMPT, STEPS)
    got, got_toks = greedy(eng, PROMPT, STEPS)
    assert copy.core_model.down_t_bytes > 0 and got_toks == want_toks
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # Built already (in memory): nothing changes.
    assert copy.use_down_t_file(tmp_path / "other.down_t") is False
    assert not (tmp_path / "other.down_t").exists()
    # Reused as it is by another engine of the same model.
    stamp = path.stat().st_mtime_ns
    again = Engine(load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=3, **SHAPE)))
    assert again.use_down_t_file(path) and path.stat().st_mtime_ns == stamp
    # Another model's file, or one cut short, is written again for this one.
    other = load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=4, **SHAPE))
    oe = Engine(other, threads=2)
    oe.use_down_t_file(path)
    oe.set_sparsity("exact-relu")
    ref, _ = greedy(Engine(other, threads=2, sparsity="exact-relu"), PROMPT, 2)
    np.testing.assert_array_equal(greedy(oe, PROMPT, 2)[0][-1], ref[-1])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    cut = Engine(load_model(synth_gguf(dtype="Q8_0", activation="relu", seed=4, **SHAPE)))
    assert cut.use_down_t_file(path) and path.read_bytes() == data
    with pytest.raises(ModelFileError):
        Engine(other).use_down_t_file(tmp_path / "missing-dir" / "x.down_t")
    moe = load_model(
        synth_gguf(dtype="F32", activation="silu", arch="qwen3moe", **MOE_ARCHS["qwen3moe"])
    )
    with pytest.raises(UnsupportedError, match="mixture of experts"):
        Engine(moe).use_down_t_file(tmp_path / "moe.down_t")
