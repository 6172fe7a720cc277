"""The model config is declared once, in Rust (crates/py/src/config.rs), and Python uses that
declaration: the loaders fill ``_core.ModelConfig`` directly, the family table holds config
values by field name, and one tensor list from the config serves the loaders' shape checks and
the engine's weight table."""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

import pytest

from powerinfer_rs import _core
from powerinfer_rs.errors import ShapeError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.archs import CONFIG_DEFAULTS, FAMILIES, Family, family_config
from powerinfer_rs.loading.types import ModelConfig, tensor_table
from powerinfer_rs.runtime.engine import core_model_arguments

from _helpers import TINY_SIZES, toy_config


def test_the_loaders_use_the_engines_class():
    assert ModelConfig is _core.ModelConfig
    c = toy_config()
    assert list(c.to_dict()) == list(ModelConfig.FIELDS)
    assert set(CONFIG_DEFAULTS) < set(ModelConfig.FIELDS)


def test_the_type_stub_lists_every_field():
    """The stub's annotations are for type checkers; they must name exactly the fields."""
    stub = Path(_core.__file__).with_name("_core.pyi")
    if not stub.is_file():
        stub = Path(__file__).parents[1] / "python" / "powerinfer_rs" / "_core.pyi"
    tree = ast.parse(stub.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelConfig")
    names = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert names == ["FIELDS", *ModelConfig.FIELDS]


def test_fields_read_set_copy_and_pickle():
    c = toy_config(eos_token_ids=[2], bos_token_id=1, sliding_window=4, rope_linear_factor=2.0)
    assert (c.n_layers, c.sliding_window, c.rope_linear_factor, c.rotary_dims) == (2, 4, 2.0, 4)
    assert c.attn_softcap == 0.0 and c.rope_freq_factors == []  # unset
    for other in (pickle.loads(pickle.dumps(c)), copy.copy(c), copy.deepcopy(c)):
        assert other == c and other is not c
    d = c.replace(n_layers=3, qkv_bias=True)
    assert (d.n_layers, d.qkv_bias, c.n_layers, c.qkv_bias) == (3, True, 2, False)
    assert d != c
    c.max_context = 16
    assert c.max_context == 16
    c.rms_eps = 1e-6  # kept as the engine's f32
    assert c.rms_eps == pytest.approx(1e-6, rel=1e-7)
    assert "n_layers" in dir(c) and "ModelConfig(arch='llama'" in repr(c)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"n_layers": -1}, ShapeError, "n_layers must be a non-negative integer"),
        ({"n_layers": True}, ShapeError, "n_layers"),
        ({"dim": 8.5}, ShapeError, "dim"),
        ({"qkv_bias": 1}, ShapeError, "qkv_bias must be a bool"),
        ({"rms_eps": "small"}, ShapeError, "rms_eps must be a number"),
        ({"activation": "tanh"}, UnsupportedError, "tanh"),
        ({"rope_style": "sideways"}, UnsupportedError, "sideways"),
        ({"bos_token_id": 2**40}, ShapeError, "too large"),
        ({"rope_freq_factors": 3}, ShapeError, "list of numbers"),
    ],
)
def test_a_bad_value_is_refused_as_it_is_set(change, error, match):
    with pytest.raises(error, match=match):
        toy_config(**change)
    c = toy_config()
    with pytest.raises(error, match=match):
        setattr(c, *next(iter(change.items())))
    assert c == toy_config()  # nothing half-set


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"n_layers": 0}, ShapeError, "n_layers must be a positive integer"),
        ({"n_kv_heads": 3}, ShapeError, "not a multiple"),
        ({"head_dim": 5}, ShapeError, "even"),
        ({"rms_eps": float("inf")}, ShapeError, "positive and finite"),
        ({"eos_token_ids": [300]}, ShapeError, "outside the vocabulary"),
        ({"relu_threshold": 0.2}, UnsupportedError, "FATReLU"),
        ({"rope_dims": 6}, ShapeError, "rope_dims"),
        ({"attn_softcap": -1.0}, ShapeError, "attn_softcap"),
    ],
)
def test_validate_checks_the_values_fit_together(change, error, match):
    toy_config().validate()
    with pytest.raises(error, match=match):
        toy_config(**change).validate()


def test_keywords_are_checked_like_a_python_call():
    with pytest.raises(TypeError, match="lacks dim"):
        ModelConfig(**{k: v for k, v in toy_config().to_dict().items() if k != "dim"})
    with pytest.raises(TypeError, match="no field 'n_layer'|no field \"n_layer\""):
        toy_config(n_layer=2)
    with pytest.raises(AttributeError):
        toy_config().n_layer  # noqa: B018
    with pytest.raises(AttributeError):
        toy_config().n_layer = 2


def test_families_hold_config_values_by_field_name():
    for f in FAMILIES:
        c = family_config(f, activation=f.activation, **TINY_SIZES)
        assert c.arch == f.name and c.rope_style == f.rope_style
        for k, v in f.config.items():
            assert getattr(c, k) == v and getattr(f, k) == v
    opt = next(f for f in FAMILIES if f.name == "opt")
    assert (opt.learned_pos, opt.pos_offset, opt.qk_norm) == (True, 2, False)
    with pytest.raises(UnsupportedError, match="no config fields"):
        Family("x", "x", "norm", (), (), config={"qkv_biass": True})


@pytest.mark.parametrize("arch", [f.name for f in FAMILIES])
def test_one_tensor_list_serves_loader_and_engine(synth_gguf, tmp_path, arch):
    """Every tensor a family's file gives the engine is in the config's list, every required
    one is there, and the engine builds from exactly those tensors."""
    extra = {"falcon": {"kv_heads": 1}, "opt": {"kv_heads": 4}, "olmoe": {"kv_heads": 4}}
    extra = extra.get(arch, {})
    tie = arch in ("gemma2", "opt")
    if arch == "gpt-oss":  # its own writer (the converter's tensors: sinks, expert biases)
        from powerinfer_rs.testing.synth_gptoss import write_gptoss_gguf

        path = write_gptoss_gguf(tmp_path / "g.gguf", dtype="F32", expert_dtype=None)
    elif arch == "deepseek2":  # its own writer (latent attention's tensors)
        from powerinfer_rs.testing.synth_deepseek2 import DeepseekSpec, write_deepseek_gguf

        path = write_deepseek_gguf(tmp_path / "ds.gguf", DeepseekSpec())
    else:
        path = synth_gguf(dtype="F32", arch=arch, tie=tie, activation="relu", **extra)
    m = load_model(path)
    table = tensor_table(m.config)
    required = {n for n, (_, _, req) in table.items() if req}
    assert required <= set(m.tensors) <= set(table)
    for n, t in m.tensors.items():
        assert (t.rows, t.cols) == table[n][:2], n
    cfg, tensors = core_model_arguments(m)
    _core.Model(cfg, tensors)
    name = next(n for n in required if n.startswith("blk.1."))
    with pytest.raises(Exception, match=name.replace(".", r"\.")):
        _core.Model(cfg, {k: v for k, v in tensors.items() if k != name})
