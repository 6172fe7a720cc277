"""The tag-to-file choice of ``org/repo[:QUANT]`` (llama.cpp's ``-hf``) on the file lists of
repos people fetch from (written out here: CI has no hub), and the hub id grammar."""

from __future__ import annotations

import pytest

from powerinfer_rs.errors import HubError
from powerinfer_rs.loading.hub import choose_files, is_hub_id, parse_hub_id, resolve_model
from powerinfer_rs.loading.hub_files import available_quants, choose_gguf, gguf_candidates

# bartowski/Qwen_Qwen3-8B-GGUF: one file per quant, an imatrix beside them.
BARTOWSKI = [".gitattributes", "README.md", "Qwen_Qwen3-8B.imatrix"] + [
    f"Qwen_Qwen3-8B-{q}.gguf"
    for q in (
        "IQ2_M IQ3_M IQ3_XS IQ3_XXS IQ4_NL IQ4_XS Q2_K Q2_K_L Q3_K_L Q3_K_M Q3_K_S Q3_K_XL "
        "Q4_0 Q4_1 Q4_K_L Q4_K_M Q4_K_S Q5_K_L Q5_K_M Q5_K_S Q6_K Q6_K_L Q8_0 bf16"
    ).split()
]
# unsloth/gpt-oss-20b-GGUF: plain quants beside unsloth's dynamic (UD-) ones.
UNSLOTH_20B = [".gitattributes", "README.md", "template"] + [
    f"gpt-oss-20b-{q}.gguf"
    for q in (
        "F16 Q2_K Q2_K_L Q3_K_M Q3_K_S Q4_0 Q4_1 Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q6_K Q8_0 "
        "UD-Q4_K_XL UD-Q6_K_XL UD-Q8_K_XL"
    ).split()
]
# ggml-org/gpt-oss-120b-GGUF: one quant, split in three.
GGML_120B = [".gitattributes", "README.md"] + [
    f"gpt-oss-120b-mxfp4-{i:05d}-of-00003.gguf" for i in (3, 1, 2)
]
# unsloth's layout for big models: small quants at the top, big ones split in a folder per
# quant; here a Q4_K_M both at the top and split in its folder.
UNSLOTH_SPLIT = [
    "README.md",
    "Qwen3-30B-A3B-Q4_K_M.gguf",
    "Qwen3-30B-A3B-UD-TQ1_0.gguf",
    "Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf",
    "Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00002-of-00002.gguf",
    "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00001-of-00002.gguf",
    "UD-Q4_K_XL/Qwen3-30B-A3B-UD-Q4_K_XL-00002-of-00002.gguf",
    "BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf",
    "BF16/Qwen3-30B-A3B-BF16-00002-of-00002.gguf",
]
# ggml-org/gemma-3-4b-it-GGUF: a vision projector beside the model files.
GEMMA_VISION = ["README.md", "mmproj-model-f16.gguf", "gemma-3-4b-it-Q4_K_M.gguf",
                "gemma-3-4b-it-f16.gguf"]  # fmt: skip
# HuggingFaceTB/SmolLM2-135M-Instruct: a safetensors repo (ONNX and runs in folders).
SMOL_HF = [
    ".gitattributes", "README.md", "config.json", "generation_config.json", "merges.txt",
    "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
    "vocab.json", "onnx/model.onnx", "runs/Nov01_12-00-00/events.out.tfevents",
]  # fmt: skip


def q(repo_files, tag, repo="org/repo"):
    return choose_gguf(repo, repo_files, tag)


def test_bartowski_quants():
    assert q(BARTOWSKI, None) == ["Qwen_Qwen3-8B-Q4_K_M.gguf"]  # the default
    assert q(BARTOWSKI, "Q6_K") == ["Qwen_Qwen3-8B-Q6_K.gguf"]  # not Q6_K_L
    assert q(BARTOWSKI, "q6_k_l") == ["Qwen_Qwen3-8B-Q6_K_L.gguf"]  # any case
    assert q(BARTOWSKI, "IQ4_XS") == ["Qwen_Qwen3-8B-IQ4_XS.gguf"]
    assert q(BARTOWSKI, "BF16") == ["Qwen_Qwen3-8B-bf16.gguf"]
    assert q(BARTOWSKI, "Q4_0") == ["Qwen_Qwen3-8B-Q4_0.gguf"]
    # A prefix of a quant is no quant: Q4_K names neither Q4_K_M nor Q4_K_S.
    with pytest.raises(HubError, match=r"no GGUF file for the tag 'Q4_K'; the repo has .*Q4_K_M"):
        q(BARTOWSKI, "Q4_K")
    assert "Qwen_Qwen3-8B.imatrix" not in str(available_quants(gguf_candidates(BARTOWSKI)))


def test_unsloth_dynamic_quants():
    assert q(UNSLOTH_20B, None) == ["gpt-oss-20b-Q4_K_M.gguf"]
    assert q(UNSLOTH_20B, "UD-Q4_K_XL") == ["gpt-oss-20b-UD-Q4_K_XL.gguf"]
    assert q(UNSLOTH_20B, "Q8_K_XL") == ["gpt-oss-20b-UD-Q8_K_XL.gguf"]  # the one there is
    assert q(UNSLOTH_20B, "f16") == ["gpt-oss-20b-F16.gguf"]


def test_a_split_file_is_fetched_whole_in_shard_order():
    shards = [f"gpt-oss-120b-mxfp4-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert q(GGML_120B, None) == shards  # no Q4_K_M: the first GGUF file
    assert q(GGML_120B, "MXFP4") == q(GGML_120B, "mxfp4") == shards
    with pytest.raises(
        HubError, match=r"org/repo: no GGUF file for the tag 'Q4_K_M'; the repo has MXFP4 \(ask"
    ):
        q(GGML_120B, "Q4_K_M")
    with pytest.raises(HubError, match=r"gpt-oss-120b-mxfp4: 2 of the 3 shards .*missing: 00002"):
        q([f for f in GGML_120B if "00002" not in f], None)


def test_the_same_quant_twice_is_ambiguous_until_a_path_names_one():
    with pytest.raises(
        HubError,
        match=r"the tag 'Q4_K_M' matches 2 files: Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf, "
        r"Qwen3-30B-A3B-Q4_K_M.gguf; name one",
    ):
        q(UNSLOTH_SPLIT, "Q4_K_M")
    with pytest.raises(HubError, match="matches 2 files"):
        q(UNSLOTH_SPLIT, None)  # the default quant too
    split = ["Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00001-of-00002.gguf",
             "Q4_K_M/Qwen3-30B-A3B-Q4_K_M-00002-of-00002.gguf"]  # fmt: skip
    assert q(UNSLOTH_SPLIT, split[0]) == split
    assert q(UNSLOTH_SPLIT, "Qwen3-30B-A3B-Q4_K_M.gguf") == ["Qwen3-30B-A3B-Q4_K_M.gguf"]
    assert q(UNSLOTH_SPLIT, "UD-Q4_K_XL")[1].endswith("UD-Q4_K_XL-00002-of-00002.gguf")
    assert q(UNSLOTH_SPLIT, "tq1_0") == ["Qwen3-30B-A3B-UD-TQ1_0.gguf"]
    assert available_quants(gguf_candidates(UNSLOTH_SPLIT)) == [
        "BF16", "Q4_K_M", "UD-Q4_K_XL", "UD-TQ1_0"
    ]  # fmt: skip


def test_the_defaults_and_exclusions_are_llama_cpps():
    assert q(["m-F16.gguf", "m-Q6_K.gguf", "m-Q8_0.gguf"], None) == ["m-Q8_0.gguf"]  # then Q8_0
    drafts = ["mtp-m-Q4_K_M.gguf", "eagle3-m-Q4_K_M.gguf", "m-imatrix-Q4_K_M.gguf"]
    assert q([*drafts, "m-Q6_K.gguf"], None) == ["m-Q6_K.gguf"]  # never a draft head
    # The tag followed by "." or "-", as llama.cpp matches it; the label itself among several.
    both = ["m-Q4_K_XL.gguf", "m-UD-Q4_K_XL.gguf"]
    assert q(both, "Q4_K_XL") == ["m-Q4_K_XL.gguf"] and q(both, "ud-q4_k_xl") == [both[1]]
    with pytest.raises(HubError, match="matches 2 files"):
        q(["a/m-Q8_0.gguf", "b/m-Q8_0.gguf"], "Q8_0")


def test_vision_projectors_are_never_the_model():
    assert q(GEMMA_VISION, None) == ["gemma-3-4b-it-Q4_K_M.gguf"]
    assert q(GEMMA_VISION, "F16") == ["gemma-3-4b-it-f16.gguf"]
    assert q(["mmproj-F16.gguf", "m-Q8_0.gguf"], None) == ["m-Q8_0.gguf"]


def test_a_safetensors_repo_fetches_its_top_level_model_files():
    files, is_dir = choose_files("HuggingFaceTB/SmolLM2-135M-Instruct", None, SMOL_HF)
    assert is_dir and files == [
        "config.json", "generation_config.json", "merges.txt", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
    ]  # fmt: skip
    with pytest.raises(HubError, match="a safetensors repo.*drop the tag 'Q4_K_M'"):
        choose_files("HuggingFaceTB/SmolLM2-135M-Instruct", "Q4_K_M", SMOL_HF)
    with pytest.raises(HubError, match=r"neither GGUF files nor .*it has: README.md, x.bin"):
        choose_files("a/b", None, ["README.md", "x.bin"])
    assert choose_files("o/r", None, BARTOWSKI) == (["Qwen_Qwen3-8B-Q4_K_M.gguf"], False)


def test_hub_id_grammar():
    assert parse_hub_id("org/repo") == ("org/repo", None)
    assert parse_hub_id("bartowski/Qwen_Qwen3-8B-GGUF:Q4_K_M") == (
        "bartowski/Qwen_Qwen3-8B-GGUF", "Q4_K_M"
    )  # fmt: skip
    assert parse_hub_id("hf.co/org/re.po:q8_0") == ("org/re.po", "q8_0")  # Ollama's form
    assert parse_hub_id("https://huggingface.co/org/repo") == ("org/repo", None)
    assert parse_hub_id("org/repo:Q4_K_M/x-00001-of-00002.gguf") == (
        "org/repo", "Q4_K_M/x-00001-of-00002.gguf"
    )  # fmt: skip
    for path in ("./org/repo", "/abs/repo", "~/models/x", "models/m.gguf", "a/b/c", "repo",
                 "org/repo:", "org/-x", "org/a..b", "org/a--b"):  # fmt: skip
        assert parse_hub_id(path) is None, path


def test_a_draft_model_may_be_a_hub_id():
    from powerinfer_rs.cli import build_parser

    a = build_parser().parse_args(["generate", "-p", "x", "--speculative", "org/draft:Q8_0"])
    assert a.speculative == "org/draft:Q8_0"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "-p", "x", "--speculative", "nodraft"])


def test_a_local_path_wins_over_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "repo").mkdir()
    assert not is_hub_id("org/repo") and resolve_model("org/repo") == "org/repo"
    assert is_hub_id("org/other")
