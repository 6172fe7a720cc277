"""Files as people download them: the synthetic GGUF files carry exactly the keys llama.cpp's
converter writes for each architecture (and no key of ours), what a GGUF file leaves implicit
is what llama.cpp's graph for the arch does, and what an HF config.json leaves out is what
transformers' config class puts there (checked against transformers itself where it is
installed; it needs no torch for its config classes).

The llama.cpp comparison of every family on these files is test_architectures_llamacpp.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from powerinfer_rs.errors import ModelFileError, UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.archs import FAMILIES, family_named
from powerinfer_rs.loading.gguf_loader import config_from_metadata, open_gguf
from powerinfer_rs.loading.hf_loader import config_from_hf
from powerinfer_rs.runtime.tokenizer import Tokenizer

from reference import exact_kv_engine, reference_logits

#: The families llama.cpp runs, their synth arguments and the activation its graph uses.
LLAMA_CPP = {
    "llama": ({}, "silu"),
    "mistral": ({"sliding_window": 6}, "silu"),
    "qwen2": ({}, "silu"),
    "qwen3": ({}, "silu"),
    "phi3": ({}, "silu"),
    "gemma2": ({"tie": True, "sliding_window": 4}, "gelu"),
    "gemma3": ({"tie": True, "layers": 6, "sliding_window": 4}, "gelu"),
    "falcon": ({"kv_heads": 1}, "gelu"),
}
_BASE = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
]
_RMS = "attention.layer_norm_rms_epsilon"
_KEY_LEN = ["attention.key_length", "attention.value_length"]
#: ``{arch}.*`` keys llama.cpp's converter writes (llama.cpp conversion/: base.py
#: TextModel.set_gguf_parameters for llama/mistral/qwen2/qwen3/gemma3, key_length only where
#: the config class has a head_dim (not Mistral's null, not Qwen2); llama.py adds vocab_size
#: and rope.dimension_count; phi.py, gemma.py Gemma2Model and falcon.py write their own).
ARCH_KEYS = {
    "llama": _BASE + ["rope.freq_base", _RMS, *_KEY_LEN, "vocab_size", "rope.dimension_count"],
    "mistral": _BASE + ["rope.freq_base", _RMS, "vocab_size", "rope.dimension_count"],
    "qwen2": _BASE + ["rope.freq_base", _RMS],
    "qwen3": _BASE + ["rope.freq_base", _RMS, *_KEY_LEN],
    "phi3": _BASE
    + [
        "rope.scaling.original_context_length",
        _RMS,
        "rope.dimension_count",
        "rope.freq_base",
        "attention.sliding_window",
    ],
    "gemma2": _BASE
    + [
        _RMS,
        *_KEY_LEN,
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "attention.sliding_window",
    ],
    "gemma3": _BASE
    + ["rope.freq_base", "rope.freq_base_swa", _RMS, *_KEY_LEN, "attention.sliding_window"],
    "falcon": _BASE + ["tensor_data_layout", "attention.layer_norm_epsilon"],
}
#: Keys outside ``{arch}.*``: ModelBase's general.* and a GPT-2 style tokenizer's.
OTHER_KEYS = {
    "general.architecture",
    "general.type",
    "general.name",
    "general.quantization_version",
    "general.file_type",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
}
#: The GGUF.* keys the file format itself has.
FORMAT_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def meta_of(path) -> dict:
    return dict(open_gguf(path).metadata)


def family_gguf(synth_gguf, arch: str, **kw):
    args, act = LLAMA_CPP[arch]
    return synth_gguf(dtype="F32", activation=act, arch=arch, **{**args, **kw})


# --------------------------------------------------------------------------- GGUF keys
@pytest.mark.parametrize("arch", list(LLAMA_CPP))
def test_gguf_files_carry_exactly_the_converters_keys(synth_gguf, arch):
    meta = meta_of(family_gguf(synth_gguf, arch))
    a = family_named(arch).gguf_arch
    keys = set(meta) - FORMAT_KEYS
    assert not [k for k in keys if k.startswith("powerinfer_rs.")]
    assert keys == OTHER_KEYS | {f"{a}.{k}" for k in ARCH_KEYS[arch]}


def test_keys_of_ours_only_where_llama_cpp_cannot_say(synth_gguf):
    """A ReLU llama, a SiLU Gemma, the exact GELU and FATReLU need our keys; nothing else."""
    cases = [
        ({"arch": "llama", "activation": "relu"}, {"powerinfer_rs.activation": "relu"}),
        (
            {"arch": "gemma2", "activation": "silu", "tie": True},
            {"powerinfer_rs.activation": "silu"},
        ),
        ({"arch": "qwen2", "activation": "gelu_erf"}, {"powerinfer_rs.activation": "gelu_erf"}),
        (
            {"arch": "llama", "activation": "relu", "relu_threshold": 0.25},
            {"powerinfer_rs.activation": "relu", "powerinfer_rs.relu_threshold": 0.25},
        ),
        ({"arch": "falcon", "activation": "gelu", "kv_heads": 1}, {}),
    ]
    for kw, want in cases:
        path = synth_gguf(dtype="F32", **kw)
        meta = meta_of(path)
        ours = {k: v for k, v in meta.items() if k.startswith("powerinfer_rs.")}
        assert ours == pytest.approx(want)
        assert load_model(path).config.activation == kw["activation"]


# --------------------------------------------------------------------------- GGUF defaults
@pytest.mark.parametrize("arch", list(LLAMA_CPP))
def test_gguf_activation_is_the_graphs(synth_gguf, arch):
    """With no key of ours, each arch runs what llama.cpp's graph for it runs (keys of ours
    dropped, so the writer's view of the family cannot hide a wrong loader default)."""
    meta = meta_of(family_gguf(synth_gguf, arch))
    meta = {k: v for k, v in meta.items() if not k.startswith("powerinfer_rs.")}
    assert config_from_metadata(meta, None).activation == LLAMA_CPP[arch][1]


def test_gguf_gemma2_defaults_when_keys_are_absent(synth_gguf):
    meta = meta_of(family_gguf(synth_gguf, "gemma2", layers=6))
    c = config_from_metadata(meta, None)
    assert (c.sliding_window, c.swa_pattern, c.attn_softcap, c.final_softcap) == (4, 2, 50, 30)
    assert c.rope_theta_local == 0.0  # the sliding layers use the global base
    for k in ("attention.sliding_window", "attn_logit_softcapping", "final_logit_softcapping"):
        del meta[f"gemma2.{k}"]
    c = config_from_metadata(meta, None)
    # llama.cpp models/gemma2.cpp: n_swa 4096, soft-caps 50 and 30 (llama-hparams.h).
    assert (c.sliding_window, c.attn_softcap, c.final_softcap) == (4096, 50.0, 30.0)
    meta["gemma2.rope.freq_base_swa"] = 5000.0
    meta["gemma2.attention.sliding_window_pattern"] = 3
    c = config_from_metadata(meta, None)
    assert (c.rope_theta_local, c.swa_pattern) == (5000.0, 3)
    meta["gemma2.attention.sliding_window_pattern"] = [i % 4 < 3 for i in range(c.n_layers)]
    assert config_from_metadata(meta, None).swa_pattern == 4
    meta["gemma2.attention.sliding_window_pattern"] = [False] + [True] * (c.n_layers - 1)
    with pytest.raises(UnsupportedError, match="pattern"):
        config_from_metadata(meta, None)


def test_gguf_gemma3_and_other_archs_read_only_their_soft_caps(synth_gguf):
    meta = meta_of(family_gguf(synth_gguf, "gemma3"))
    c = config_from_metadata(meta, None)
    assert (c.sliding_window, c.swa_pattern, c.rope_theta_local) == (4, 6, 10000.0)
    assert (c.attn_softcap, c.final_softcap) == (0.0, 0.0)
    # llama.cpp's gemma3 never applies an attention soft-cap, a final one when the file has it.
    meta["gemma3.attn_logit_softcapping"] = 20.0
    meta["gemma3.final_logit_softcapping"] = 15.0
    meta["gemma3.rope.freq_base_swa"] = 20000.0
    c = config_from_metadata(meta, None)
    assert (c.attn_softcap, c.final_softcap, c.rope_theta_local) == (0.0, 15.0, 20000.0)
    del meta["gemma3.attention.sliding_window"]  # no window key: no sliding layers
    assert config_from_metadata(meta, None).sliding_window == 0
    for arch in ("llama", "qwen2", "phi3", "falcon"):
        meta = meta_of(family_gguf(synth_gguf, arch))
        a = family_named(arch).gguf_arch
        meta[f"{a}.attn_logit_softcapping"] = 20.0
        meta[f"{a}.final_logit_softcapping"] = 15.0
        c = config_from_metadata(meta, None)
        assert (c.attn_softcap, c.final_softcap) == (0.0, 0.0), arch


@pytest.mark.parametrize("arch", ["llama", "falcon"])
def test_gguf_norm_epsilon_is_required(synth_gguf, arch):
    """llama.cpp refuses a file without its norm epsilon; so do we (no silent 1e-5)."""
    meta = meta_of(family_gguf(synth_gguf, arch))
    key = next(k for k in meta if "layer_norm" in k and k.endswith("epsilon"))
    del meta[key]
    with pytest.raises(ModelFileError, match=key):
        config_from_metadata(meta, None)


def test_gguf_gemma2_head_is_always_the_embeddings(synth_gguf, tmp_path):
    """llama.cpp's gemma2 never reads output.weight: a file holding one runs tied."""
    import gguf

    src = family_gguf(synth_gguf, "gemma2")
    reader = gguf.GGUFReader(str(src))
    out = tmp_path / "with_output.gguf"
    w = gguf.GGUFWriter(str(out), "gemma2")
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0], f.types[-1] if f.types else None)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("output.weight", -np.asarray(emb.data), raw_dtype=emb.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m, ref = load_model(out), load_model(src)
    assert m.config.tie_embeddings
    ids = [5, 9, 17, 33]
    np.testing.assert_array_equal(
        exact_kv_engine(m, threads=2).logits(ids), exact_kv_engine(ref).logits(ids)
    )


def test_gguf_tokenizer_defaults_are_llama_cpps(synth_gguf):
    meta = meta_of(family_gguf(synth_gguf, "llama"))
    del meta["tokenizer.ggml.add_bos_token"]
    assert not Tokenizer.from_gguf(meta).add_bos  # "gpt-2": no BOS
    meta["tokenizer.ggml.pre"] = "llama-bpe"
    assert Tokenizer.from_gguf(meta).add_bos  # llama-vocab.cpp: the llama3 pre adds BOS
    del meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
    tok = Tokenizer.from_gguf(meta)
    assert (tok.bos_id, tok.eos_ids) == (11, [11])  # llama-vocab.cpp's BPE defaults


# --------------------------------------------------------------------------- HF config.json
try:
    import transformers
except ImportError:  # the GGUF tests above still run
    transformers = None
needs_transformers = pytest.mark.skipif(transformers is None, reason="transformers not installed")
HF = {
    f.name: f
    for f in FAMILIES
    # Bamboo's and SmallThinker's config classes are their repositories' own code; gpt-oss's
    # synthetic directories come from its own writer (tests/test_gptoss.py); DeepSeek's carry
    # the keys of the published configs (of the models' own code: scoring_func, topk_method,
    # ...), written by synth_deepseek2 and read in test_deepseek2.
    if f.name not in ("bamboo", "gpt-oss", "deepseek2") and (not f.moe or f.hf_experts)
}
#: Families' synth arguments for HF directories.
HF_ARGS = {
    **{k: v[0] for k, v in LLAMA_CPP.items()},
    "opt": {"tie": True, "heads": 4, "kv_heads": 4},
    "falcon": {"kv_heads": 1},
    "olmoe": {"kv_heads": 4},
}


def config_class(fam):
    return transformers.AutoConfig.for_model(fam.hf_types[0]).__class__


def class_default(fam, key):
    """transformers' value for ``key`` when config.json leaves it out."""
    cfg = config_class(fam)()
    if key == "sliding_window_pattern":
        return cfg._sliding_window_pattern
    return getattr(cfg, key)


@needs_transformers
@pytest.mark.parametrize("name", [*HF, "gpt-oss"])
def test_family_hf_defaults_are_transformers(name):
    fam = family_named(name)
    cls = config_class(fam)
    cfg = cls()
    for key, ours in fam.hf_defaults.items():
        theirs = class_default(fam, key)
        if ours is None and key in ("head_dim", "word_embed_proj_dim"):
            derived = cfg.hidden_size // cfg.num_attention_heads if key == "head_dim" else None
            assert theirs in (None, derived, cfg.hidden_size), key
        elif ours is None and key in ("num_key_value_heads", "num_kv_heads"):
            assert theirs in (None, cfg.num_attention_heads), key
        elif ours is None and key == "ffn_hidden_size":
            assert theirs in (None, 4 * cfg.hidden_size), key
        else:
            assert theirs == ours, (name, key, theirs, ours)
    # The activation key is the one the modeling code reads, and the eps key exists.
    assert hasattr(cfg, fam.hf_act_key)
    assert not fam.hf_eps_key or hasattr(cfg, fam.hf_eps_key)


#: Keys the loader requires although the classes have defaults: the family, and the sizes
#: (a default would only move the error to the tensors' shapes).
REQUIRED = {"architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers"}
REQUIRED |= {"num_attention_heads", "intermediate_size", "ffn_dim"}


def _write(synth_hf, name, **kw):
    return synth_hf(dtype="f32", arch=name, **{**HF_ARGS.get(name, {}), **kw})


@needs_transformers
@pytest.mark.parametrize("name", list(HF))
def test_synthetic_config_json_is_what_the_class_saves(synth_hf, name):
    """Every key of the synthetic config.json is one the family's class saves (no key of
    ours), and the class reads the same model from it."""
    fam = HF[name]
    d = _write(synth_hf, name)
    cfg = json.loads((d / "config.json").read_text())
    # PretrainedConfig's own fields are saved only where they differ from its defaults.
    saved = set(config_class(fam)().to_diff_dict()) | {"architectures", "torch_dtype"}
    saved |= {"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"}
    assert set(cfg) <= saved, set(cfg) - saved
    tf = transformers.AutoConfig.for_model(**cfg)
    ours = config_from_hf(cfg)
    assert (tf.hidden_size, tf.num_hidden_layers, tf.vocab_size) == (
        ours.dim,
        ours.n_layers,
        ours.vocab_size,
    )


def _stripped_and_filled(fam, cfg: dict, keys) -> tuple[dict, dict]:
    """config.json without ``keys``, and what transformers' class makes of that file."""
    stripped = {k: v for k, v in cfg.items() if k not in keys}
    args = {k: v for k, v in stripped.items() if k != "model_type"}
    filled = config_class(fam)(**args).to_dict()
    return stripped, {**filled, "architectures": cfg["architectures"]}


@needs_transformers
@pytest.mark.parametrize("name", list(HF))
def test_every_optional_key_falls_back_as_transformers(synth_hf, name):
    """Each key left out alone, and all of them at once: the loader reads the file as it
    reads the full config transformers fills in from it."""
    fam = HF[name]
    d = _write(synth_hf, name)
    cfg = json.loads((d / "config.json").read_text())
    optional = [k for k in cfg if k not in REQUIRED]
    for key in [*([k] for k in optional), optional]:
        stripped, filled = _stripped_and_filled(fam, cfg, set(key))
        try:
            want = config_from_hf(filled)
        except (UnsupportedError, ModelFileError) as e:  # a default the engine refuses
            with pytest.raises(type(e)):
                config_from_hf(stripped)
            continue
        assert config_from_hf(stripped) == want, (name, key)


@needs_transformers
@pytest.mark.parametrize("name", list(HF))
def test_stripped_directory_still_loads_the_same_model(synth_hf, tmp_path, name):
    """Every key whose value is the class's default is stripped from a real directory: the
    model loads and gives the same logits."""
    fam = HF[name]
    d = _write(synth_hf, name)
    cfg = json.loads((d / "config.json").read_text())
    out = tmp_path / name
    shutil.copytree(d, out)
    strip = set()
    for k, v in cfg.items():
        if k in REQUIRED:
            continue
        _, filled = _stripped_and_filled(fam, cfg, {k})
        if filled.get(k, "absent") == v:
            strip.add(k)
    assert strip  # something to strip in every family
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k not in strip}))
    full, stripped = load_model(d), load_model(out)
    assert stripped.config == full.config
    ids = [5, 9, 17, 33, 40]
    np.testing.assert_array_equal(
        exact_kv_engine(stripped).logits(ids), exact_kv_engine(full).logits(ids)
    )


# --------------------------------------------------------------------------- HF activations
def test_hf_exact_gelu_falcon_matches_the_reference_and_the_tanh_one_differs(synth_hf):
    """transformers' "gelu" (Falcon's default) is the erf form: the engine runs it."""
    m = load_model(_write(synth_hf, "falcon", activation="gelu_erf"))
    assert json.loads((Path(m.path) / "config.json").read_text())["activation"] == "gelu"
    assert m.config.activation == "gelu_erf"
    ids = [int(t) for t in np.random.default_rng(4).integers(3, m.config.vocab_size, 12)]
    ref = reference_logits(m, ids)
    got = exact_kv_engine(m, threads=2).logits(ids)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 1e-5
    tanh = load_model(_write(synth_hf, "falcon", activation="gelu"))
    assert tanh.config.activation == "gelu"
    other = exact_kv_engine(tanh, threads=2).logits(ids)
    assert np.linalg.norm(other - got) / np.linalg.norm(got) > 1e-4


def test_hf_falcon_with_a_kv_head_per_query_head_is_reordered(synth_hf, synth_gguf):
    """Old-layout Falcon without multi-query stores q/k/v head by head; llama.cpp's converter
    writes [q; k; v]. Both load as the same function."""
    kw = {"arch": "falcon", "activation": "gelu", "kv_heads": 4, "heads": 4}
    hf, gg = load_model(synth_hf(dtype="f32", **kw)), load_model(synth_gguf(dtype="F32", **kw))
    assert hf.config.n_kv_heads == gg.config.n_kv_heads == 4
    ids = [5, 9, 17, 33, 40, 41]
    a, b = exact_kv_engine(hf, threads=2).logits(ids), exact_kv_engine(gg, threads=2).logits(ids)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-5
    assert np.linalg.norm(a - reference_logits(gg, ids)) / np.linalg.norm(b) <= 1e-5


# --------------------------------------------------------------------------- transformers 5
def _as_v5(cfg: dict) -> dict:
    """config.json as transformers 5 saves it: the RoPE keys inside ``rope_parameters``."""
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    glob = {"rope_type": "default", **(cfg.get("rope_scaling") or {})}
    glob["rope_theta"] = cfg["rope_theta"]
    if "partial_rotary_factor" in cfg:
        glob["partial_rotary_factor"] = out.pop("partial_rotary_factor")
    if "rope_local_base_freq" in cfg:
        local = {"rope_type": "default", "rope_theta": out.pop("rope_local_base_freq")}
        out["rope_parameters"] = {"full_attention": glob, "sliding_attention": local}
    else:
        out["rope_parameters"] = glob
    return out


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("qwen3", {"rope_theta": 1e6}),
        ("llama", {"rope_scaling": "llama3", "rope_factor": 8.0}),
        ("phi3", {"partial_rotary": 0.5}),
        ("gemma3", {"rope_theta": 1e6, "rope_scaling": "linear", "rope_factor": 8.0}),
    ],
)
def test_transformers_5_rope_parameters_read_as_the_4x_keys(synth_hf, name, kw):
    """A config saved by transformers 5 keeps RoPE's base and scaling in rope_parameters:
    the same model as the 4.x spelling (the defaults alone would give another base)."""
    cfg = json.loads((_write(synth_hf, name, **kw) / "config.json").read_text())
    v5 = _as_v5(cfg)
    assert "rope_theta" not in v5 and "rope_parameters" in v5
    assert config_from_hf(v5) == config_from_hf(cfg)
    without = {k: v for k, v in v5.items() if k != "rope_parameters"}
    assert config_from_hf(without) != config_from_hf(cfg)
