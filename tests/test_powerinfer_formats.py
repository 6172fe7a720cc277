"""PowerInfer's files: .pt reader/writer (no torch), predictor and activation directories (layer
order past 10), PWRI GGUF models with per-layer predictors, and malformed inputs."""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, ShapeError, UnsupportedError
from powerinfer_rs.formats.profile import read_profile, write_profile
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.gguf_file import GGUFFile
from powerinfer_rs.loading.powerinfer_dirs import (
    import_powerinfer_activations,
    import_powerinfer_predictors,
)
from powerinfer_rs.loading.powerinfer_gguf import is_powerinfer_gguf, load_powerinfer_gguf
from powerinfer_rs.loading.torch_pt import load_pt, load_state_dict, load_tensor, save_pt
from powerinfer_rs.testing.powerinfer_files import (
    random_predictors,
    write_powerinfer_activation_dir,
    write_powerinfer_gguf,
    write_powerinfer_gpu_index,
    write_powerinfer_predictor_dir,
)
from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights

from conftest import SMALL


# --------------------------------------------------------------------------- .pt files
def test_pt_round_trip_dtypes(tmp_path):
    rng = np.random.default_rng(0)
    sd = {
        "fc1.weight": rng.standard_normal((3, 5)).astype(np.float16),
        "fc2.weight": rng.standard_normal((7, 3)).astype(np.float32),
        "counts": np.arange(11, dtype=np.int64) * 10**12,
        "f64": np.linspace(0, 1, 4),
        "flags": np.array([True, False, True]),
        "i8": np.array([-3, 4], np.int8),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.float32),
    }
    path = save_pt(tmp_path / "model_0.pt", sd)
    back = load_pt(path)
    assert list(back) == list(sd)  # an OrderedDict in save order
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        np.testing.assert_array_equal(back[k], v)
    assert load_state_dict(path).keys() == sd.keys()
    t = rng.standard_normal((4, 6)).astype(np.float32).T  # non-contiguous input
    np.testing.assert_array_equal(load_tensor(save_pt(tmp_path / "t.pt", t)), t)
    with zipfile.ZipFile(path) as z:  # torch's layout, data 64-byte aligned
        names = z.namelist()
        assert names[0] == "model_0/data.pkl" and "model_0/version" in names
        assert z.read("model_0/byteorder") == b"little"
        for info in z.infolist():
            assert info.compress_type == zipfile.ZIP_STORED
            assert (info.header_offset + 30 + len(info.filename) + len(info.extra)) % 64 == 0
        ops = {op.name for op, _, _ in __import__("pickletools").genops(z.read(names[0]))}
        assert "BINPERSID" in ops
    with pytest.raises(UnsupportedError):
        save_pt(tmp_path / "x.pt", np.zeros(2, np.complex64))


def test_pt_reads_strided_and_bf16(tmp_path):
    """Hand-made pickle: a transposed view with an offset into a shared storage, and bf16."""
    from powerinfer_rs.loading import pickle_ops as po

    store = np.arange(20, dtype=np.float32)
    bf = (np.array([1.0, -2.5], np.float32).view(np.uint32) >> 16).astype(np.uint16)

    def tensor(storage: str, key: str, numel: int, offset: int, shape, stride) -> bytes:
        """The pickle of ``torch._utils._rebuild_tensor_v2`` on storage record ``key``."""
        location = [po.unicode_op("storage"), po.global_op("torch", storage), po.unicode_op(key)]
        pid = po.tuple_op([*location, po.unicode_op("cpu"), po.int_op(numel)]) + b"Q"
        return po.global_op("torch._utils", "_rebuild_tensor_v2") + po.tuple_op(
            [
                pid,
                po.int_op(offset),
                po.tuple_op([po.int_op(n) for n in shape]),
                po.tuple_op([po.int_op(n) for n in stride]),
                b"\x89",
                po.global_op("collections", "OrderedDict") + b")R",
            ]
        )

    body = (
        po.global_op("collections", "OrderedDict")
        + b")R("
        + po.unicode_op("a")
        + tensor("FloatStorage", "0", 20, 2, (3, 2), (1, 5))
        + b"R"
        + po.unicode_op("b")
        + tensor("BFloat16Storage", "1", 2, 0, (2,), (1,))
        + b"Ru"
    )
    path = tmp_path / "s.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("s/data.pkl", b"\x80\x02" + body + b".")
        z.writestr("s/data/0", store.tobytes())
        z.writestr("s/data/1", bf.tobytes())
        z.writestr("s/version", b"3\n")
    got = load_pt(path)
    np.testing.assert_array_equal(got["a"], store[2:12].reshape(2, 5)[:, :3].T)  # offset 2
    np.testing.assert_array_equal(got["b"], [1.0, -2.5])
    assert got["b"].dtype == np.float32


def _zip_with_pickle(path, pkl: bytes, records: dict[str, bytes] | None = None):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("m/data.pkl", pkl)
        for k, v in (records or {}).items():
            z.writestr(f"m/{k}", v)
    return path


def test_pt_malformed_and_hostile(tmp_path):
    good = save_pt(tmp_path / "g.pt", {"w": np.ones((2, 3), np.float32)})
    raw = good.read_bytes()
    for data in (b"", b"PK\x03\x04garbage", raw[: len(raw) // 2], b"not a zip at all"):
        (tmp_path / "bad.pt").write_bytes(data)
        with pytest.raises(ModelFileError):
            load_pt(tmp_path / "bad.pt")
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(UnsupportedError, match="legacy"):
        load_pt(tmp_path / "legacy.pt")

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, ("echo pwned",))

    with pytest.raises(ModelFileError, match="refused"):
        load_pt(_zip_with_pickle(tmp_path / "evil.pt", pickle.dumps(Evil(), protocol=2)))
    with pytest.raises(ModelFileError):  # garbage pickle
        load_pt(_zip_with_pickle(tmp_path / "gp.pt", b"\x80\x02\xff\xfe"))
    with zipfile.ZipFile(good) as z:
        pkl = z.read("g/data.pkl")
    with pytest.raises(ModelFileError, match="missing"):  # storage record absent
        load_pt(_zip_with_pickle(tmp_path / "ns.pt", pkl))
    with pytest.raises(ModelFileError, match="bytes"):  # storage too short
        load_pt(_zip_with_pickle(tmp_path / "short.pt", pkl, {"data/0": b"\x00" * 8}))
    with pytest.raises(ModelFileError, match="not a state dict"):
        load_state_dict(save_pt(tmp_path / "t.pt", np.zeros(3)))
    with pytest.raises(ModelFileError, match="not a tensor"):
        load_tensor(good)
    with pytest.raises(ModelFileError):
        load_pt(tmp_path / "nope.pt")


# --------------------------------------------------------------------------- directories
def test_predictor_dir_orders_layers_by_number(tmp_path):
    n = 12
    ranks = [4 + i for i in range(n)]  # every layer a different rank: order is visible
    preds = random_predictors(n, 16, 40, ranks, seed=1)
    d = write_powerinfer_predictor_dir(tmp_path / "pred", preds, sparse_threshold=0.25)
    assert sorted(p.name for p in d.glob("*.pt"))[:4] == [
        "model_0.pt",
        "model_1.pt",
        "model_10.pt",
        "model_11.pt",
    ]  # string order mixes up
    pset = import_powerinfer_predictors(d)
    assert sorted(pset.layers) == list(range(n)) and pset.input == "ffn_inp"
    for i in range(n):
        p = pset.layers[i]
        assert p.rank == ranks[i] and p.threshold == 0.25
        np.testing.assert_array_equal(p.fc1, preds[i].fc1.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(p.fc2, preds[i].fc2.astype(np.float16).astype(np.float32))
    assert import_powerinfer_predictors(d, threshold=-1.0).layers[3].threshold == -1.0
    (d / "config.json").unlink()
    assert import_powerinfer_predictors(d).layers[0].threshold == 0.0  # PowerInfer's default
    (d / "config.json").write_text("{oops")
    with pytest.raises(ModelFileError):
        import_powerinfer_predictors(d)
    (d / "config.json").write_text(json.dumps({"sparse_threshold": "high"}))
    with pytest.raises(ModelFileError):
        import_powerinfer_predictors(d)
    (d / "config.json").write_text("{}")
    (d / "model_5.pt").rename(d / "model_05.pt")
    (d / "model_3.pt").rename(tmp_path / "away.pt")
    with pytest.raises(ModelFileError, match=r"missing for layers \[3\]"):
        import_powerinfer_predictors(d)
    save_pt(d / "model_3.pt", {"fc1.weight": np.ones((2, 16), np.float32)})
    with pytest.raises(ModelFileError, match="fc2.weight"):
        import_powerinfer_predictors(d)
    save_pt(d / "model_3.pt", {"fc1.weight": np.ones((2, 16)), "fc2.weight": np.ones((40, 3))})
    with pytest.raises(ModelFileError, match="do not fit"):
        import_powerinfer_predictors(d)
    save_pt(d / "model_3.pt", {"fc1.weight": np.ones((2, 16)), "fc2.weight": np.ones((40, 2))})
    save_pt(d / "model_5.pt", {"fc1.weight": np.ones((2, 16)), "fc2.weight": np.ones((40, 2))})
    with pytest.raises(ModelFileError, match="twice"):
        import_powerinfer_predictors(d)
    with pytest.raises(ModelFileError):
        import_powerinfer_predictors(tmp_path / "missing")


def test_activation_dir_to_profile(tmp_path):
    n, ffn = 12, 30
    rng = np.random.default_rng(2)
    counts = [rng.integers(0, 500, ffn) + i * 1000 for i in range(n)]  # layer i >= i*1000
    d = write_powerinfer_activation_dir(tmp_path / "act", counts)
    prof = import_powerinfer_activations(d, "fp123", tokens=12_000)
    assert prof.n_layers == n and prof.tokens == 12_000 and prof.model_fingerprint == "fp123"
    for i in range(n):
        np.testing.assert_array_equal(prof.counts[i], counts[i])
    out = write_profile(
        tmp_path / "prof",
        prof.counts,
        prof.tokens,
        model_fingerprint=prof.model_fingerprint,
        extra_meta=prof.meta,
    )
    back = read_profile(out)
    assert back.tokens == 12_000 and back.meta["source"] == "powerinfer-activations"
    np.testing.assert_array_equal(back.counts[11], counts[11])
    est = import_powerinfer_activations(d)
    assert est.tokens == max(int(c.max()) for c in counts)
    assert est.meta["tokens_estimated"] == "true"
    fl = write_powerinfer_activation_dir(
        tmp_path / "f", [np.array([1.0, 2.4, 0.0])], dtype=np.float32
    )
    np.testing.assert_array_equal(import_powerinfer_activations(fl).counts[0], [1, 2, 0])
    save_pt(fl / "activation_0.pt", np.array([1.0, -1.0]))
    with pytest.raises(ModelFileError, match="negative"):
        import_powerinfer_activations(fl)
    save_pt(fl / "activation_0.pt", np.ones((2, 2)))
    with pytest.raises(ModelFileError, match="1-D"):
        import_powerinfer_activations(fl)
    save_pt(fl / "activation_0.pt", np.array([1, 2]))
    save_pt(fl / "activation_1.pt", np.array([1, 2, 3]))
    with pytest.raises(ModelFileError, match="different neuron counts"):
        import_powerinfer_activations(fl)


# --------------------------------------------------------------------------- PWRI GGUF
def test_pwri_gguf_model_and_predictors(tmp_path):
    shape = dict(SMALL)
    ranks = [8, 24]  # rank differs per layer
    preds = random_predictors(shape["layers"], shape["dim"], shape["ffn"], ranks, seed=3)
    path = write_powerinfer_gguf(
        tmp_path / "m.powerinfer.gguf", **shape, predictors=preds, sparse_threshold=0.5
    )
    assert path.read_bytes()[:4] == b"PWRI" and is_powerinfer_gguf(path)
    with pytest.raises(ModelFileError, match="magic"):
        GGUFFile(path)  # the default parser still insists on GGUF
    with pytest.raises(ModelFileError):
        load_model(path)
    assert GGUFFile(path, allow_powerinfer=True).magic == b"PWRI"
    pm = load_powerinfer_gguf(path)
    m, c = pm.model, pm.model.config
    assert (c.dim, c.ffn_dim, c.n_layers, c.activation) == (64, 128, 2, "relu")
    assert pm.sparse_threshold == 0.5
    gen = SynthWeights(SynthSpec(**{**shape, "activation": "relu"}))
    for i in range(c.n_layers):
        t = m.tensors[f"blk.{i}.ffn_down_t"]
        assert (t.rows, t.cols, t.dtype) == (128, 64, "F32")
        assert f"blk.{i}.ffn_down" not in m.tensors and f"blk.{i}.fc1" not in m.tensors
        np.testing.assert_array_equal(
            np.asarray(t.data).view(np.float32).reshape(128, 64), gen.tensor(f"blk.{i}.ffn_down").T
        )
        p = pm.predictors.layers[i]
        assert p.rank == ranks[i] and p.threshold == 0.5
        np.testing.assert_array_equal(p.fc1, preds[i].fc1.astype(np.float16).astype(np.float32))
        # PowerInfer's semantics, in numpy: active iff fc2 @ relu(fc1 @ x) >= threshold
        x = np.random.default_rng(i).standard_normal((5, 64)).astype(np.float32)
        ref = np.maximum(x @ p.fc1.T, 0) @ p.fc2.T >= 0.5
        np.testing.assert_array_equal(p.predict(x), ref)
    assert pm.predictors.input == "ffn_inp" and pm.predictors.model_fingerprint == m.fingerprint
    assert load_powerinfer_gguf(path, threshold=-2.0).predictors.layers[1].threshold == -2.0
    nokey = write_powerinfer_gguf(
        tmp_path / "n.gguf", **shape, ranks=4, sparse_threshold=None, dtype="F16"
    )
    pn = load_powerinfer_gguf(nokey)
    assert pn.sparse_threshold == 0.0 and pn.model.tensors["blk.0.ffn_down_t"].dtype == "F16"


def test_pwri_gguf_malformed(tmp_path, synth_gguf):
    path = write_powerinfer_gguf(tmp_path / "m.gguf", **SMALL, ranks=4)
    raw = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    for data in (
        raw[:20],
        raw[:200],
        raw[: len(raw) // 2],
        b"PWRI" + struct.pack("<I", 3) + b"\xff" * 100,
    ):
        bad.write_bytes(data)
        with pytest.raises(ModelFileError):
            load_powerinfer_gguf(bad)
    with pytest.raises(ModelFileError, match="not a PowerInfer"):
        load_powerinfer_gguf(synth_gguf())  # a plain GGUF
    # a PWRI file whose layer 1 has no predictor
    names = [t.name for t in GGUFFile(path, allow_powerinfer=True).tensors]
    assert names[:4] == [
        "blk.0.fc1.weight",
        "blk.0.fc2.weight",
        "blk.1.fc1.weight",
        "blk.1.fc2.weight",
    ]
    doctored = bytearray(raw)
    i = doctored.find(b"blk.1.fc2.weight")
    doctored[i : i + 16] = b"blk.1.fc9.weight"
    bad.write_bytes(bytes(doctored))
    with pytest.raises(ModelFileError, match="lacks its predictor"):
        load_powerinfer_gguf(bad)
    assert struct.unpack("<I", raw[4:8])[0] == 3 and io.BytesIO(raw).read(4) == b"PWRI"


def _gpu_index_tensors(path) -> tuple[GGUFFile, dict[str, np.ndarray]]:
    f = GGUFFile(path, allow_powerinfer=True)
    raw = path.read_bytes()
    out = {}
    for t in f.tensors:
        assert t.type_name == "I32"
        out[t.name] = np.frombuffer(raw[t.offset : t.offset + t.nbytes], dtype="<i4")
    return f, out


def test_gpu_index_is_written_as_powerinfer_exports_it(tmp_path):
    """PowerInfer's GPU index (``<model>.generated.gpuidx``, as its ``export_split`` writes it):
    PWRI magic and version 3, architecture ``generic.gpu_index``, block count, VRAM capacity,
    per layer gpu_idx (0/1 over the FFN) then gpu_bucket (sorted ids), in layer order; a layer
    with no GPU neuron, ids out of order; bad ids refused."""
    ffn = 40
    layers = [np.array([7, 3, 39, 0]), np.arange(ffn), np.array([], dtype=np.int64)]
    path = write_powerinfer_gpu_index(tmp_path / "m.gguf.generated.gpuidx", layers, ffn, 12345)
    raw = path.read_bytes()
    assert raw[:4] == b"PWRI" and struct.unpack("<I", raw[4:8])[0] == 3
    f, t = _gpu_index_tensors(path)
    assert f.metadata["general.architecture"] == "generic.gpu_index"
    assert f.metadata["generic.gpu_index.block_count"] == 3
    assert f.metadata["split.vram_capacity"] == 12345
    assert [x.name for x in f.tensors] == [
        f"blk.{i}.{k}" for i in range(3) for k in ("gpu_idx", "gpu_bucket")
    ]
    for i, ids in enumerate(layers):
        want = np.zeros(ffn, dtype=np.int32)
        want[ids] = 1
        assert np.array_equal(t[f"blk.{i}.gpu_idx"], want)
        assert np.array_equal(t[f"blk.{i}.gpu_bucket"], np.sort(ids))
    for bad in ([np.array([0, ffn])], [np.array([-1])], [np.array([2, 2])]):
        with pytest.raises(ShapeError):
            write_powerinfer_gpu_index(tmp_path / "bad.gpuidx", bad, ffn, 1)
