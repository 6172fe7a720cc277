"""The Rust engine against the float64 numpy reference (tests/reference.py), on the real
SmolLM2 GGUF and on synthetic ReLU llamas in every weight format, plus generation behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ShapeError
from powerinfer_rs.loading import load_model

from reference import exact_kv_engine, greedy_reference, reference_logits

#: ||engine - reference|| / ||reference|| allowed at every position (the issue's bound).
LOGITS_RTOL = 1e-3

TEXT = (
    "The river runs through the old town, past the market square and the stone bridge that "
    "was built four hundred years ago. In the morning, fishermen bring their catch to the "
    "stalls, and children walk along the water on their way to school. Visitors often stop to "
    "watch the boats, take photographs of the church tower, and drink coffee in the small "
    "cafes that line the quiet streets near the harbour."
)


def assert_rows_close(got: np.ndarray, ref: np.ndarray, rtol: float = LOGITS_RTOL) -> float:
    assert got.shape == ref.shape and got.dtype == np.float32
    err = np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)
    assert err.max() <= rtol, f"worst position {int(err.argmax())}: {err.max():.2e}"
    return float(err.max())


@pytest.fixture(scope="module")
def smol_engine(smol):
    return Engine(smol, threads=2)


def test_smollm2_logits_match_reference(smol):
    """The arithmetic against float64, with the KV cache kept in f32 as the reference keeps it
    (the default f16 cache's rounding alone is ~1e-3 here: tests/test_kv_cache.py judges it)."""
    ids = smol.tokenizer.encode(TEXT, add_bos=False)
    assert len(ids) >= 64
    got = exact_kv_engine(smol, threads=2).logits(ids)
    assert_rows_close(got, reference_logits(smol, ids))


def test_smollm2_greedy_continuation_matches_reference(smol, smol_engine):
    prompt = "The capital of France is"
    ids = smol.tokenizer.encode(prompt)
    n_new = 8
    ref_ids = greedy_reference(smol, ids, n_new)
    assert len(ref_ids) == n_new
    text = smol_engine.generate(prompt, max_new_tokens=n_new, temperature=0, ignore_eos=True)
    assert text == smol.tokenizer.decode(ref_ids)
    assert text.startswith(" Paris")


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_synthetic_relu_hf_matches_reference(synth_hf, dtype):
    model = load_model(synth_hf(dtype=dtype, activation="relu"))
    assert model.config.activation == "relu" and model.config.rope_style == "neox"
    ids = list(np.random.default_rng(1).integers(0, model.config.vocab_size, 70))
    assert_rows_close(Engine(model, threads=2).logits(ids), reference_logits(model, ids))


# BF16 is covered by the HF test above (GGUF BF16 files are rare and not written by synth).
@pytest.mark.parametrize("dtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
def test_synthetic_gguf_every_format_matches_reference(synth_gguf, dtype):
    model = load_model(synth_gguf(dtype=dtype))
    ids = list(np.random.default_rng(2).integers(0, model.config.vocab_size, 40))
    assert_rows_close(Engine(model, threads=3).logits(ids), reference_logits(model, ids))


def test_weights_reach_rust_without_copy(smol):
    """Rows read by index stay in the file's map; the whole-matrix products' matrices (the
    attention's and the head's always, the FFN's when the engine decodes dense on the CPU) are
    interleaved at load in place of it."""
    sparse = Engine(smol, threads=1, mmap=True, sparsity="threshold", thresholds=[0.01] * 30)
    dense = Engine(smol, threads=1, mmap=True)
    assert not sparse.weights_copied and not dense.weights_copied
    for name in ["blk.0.ffn_gate", "blk.29.ffn_down"]:
        assert sparse.tensor_layout(name) == "rows"
        assert sparse.tensor_address(name) == smol.tensors[name].data.ctypes.data
    # Tied: the output head (Q8_0 here) is the embedding table itself, one interleaved matrix.
    for eng in [sparse, dense]:
        assert eng.tensor_layout("output") == eng.tensor_layout("token_embd") == "interleaved"
        assert eng.tensor_address("output") == eng.tensor_address("token_embd")
    for eng, names in [
        (sparse, ["blk.0.attn_q", "blk.29.attn_output", "output"]),
        (dense, ["blk.0.attn_q", "blk.0.ffn_gate", "blk.29.ffn_down", "token_embd"]),
    ]:
        for name in names:
            assert eng.tensor_layout(name) == "interleaved"
            assert eng.tensor_address(name) != smol.tensors[name].data.ctypes.data
    with pytest.raises(KeyError):
        dense.tensor_layout("blk.0.attn_norm")


def test_zero_copy_for_hf_bf16(synth_hf):
    model = load_model(synth_hf(dtype="bf16"))
    eng = Engine(model, threads=1, mmap=True)
    assert eng.tensor_address("blk.1.ffn_up") == model.tensors["blk.1.ffn_up"].data.ctypes.data


def test_copied_weights_sit_on_huge_page_boundaries_and_give_the_same_logits(smol):
    """mmap=False copies every tensor of 2 MiB or more into memory of its own, 2 MiB aligned
    (the embedding table of a sparse engine, which keeps the FFN's rows: its tied head is
    interleaved there instead); small ones stay borrowed; logits are bit-identical."""
    kw = dict(threads=2, sparsity="threshold", thresholds=[0.01] * 30)
    mapped = Engine(smol, mmap=True, **kw)
    copied = Engine(smol, mmap=False, **kw)
    assert copied.weights_copied
    emb = smol.tensors["token_embd"].data
    assert emb.nbytes >= 2 << 20
    assert copied.tensor_address("token_embd") != emb.ctypes.data
    assert copied.tensor_address("token_embd") % (2 << 20) == 0
    # A small matrix is not copied; a dense engine's is interleaved (in place of the map).
    small = smol.tensors["blk.0.ffn_up"].data
    assert small.nbytes < 2 << 20
    assert copied.tensor_address("blk.0.ffn_up") == small.ctypes.data
    dense = Engine(smol, threads=2, mmap=False)
    assert dense.tensor_layout("blk.0.ffn_up") == "interleaved"
    assert dense.tensor_address("blk.0.ffn_up") != small.ctypes.data
    ids = smol.tokenizer.encode("The weights moved but the numbers did not", add_bos=False)
    np.testing.assert_array_equal(copied.logits(ids), mapped.logits(ids))


@pytest.mark.parametrize("bad", ["yes", 0, 1.0])
def test_mmap_argument_is_checked(smol, bad):
    with pytest.raises(ShapeError, match="mmap"):
        Engine(smol, threads=1, mmap=bad)


def test_decode_equals_scoring(smol, smol_engine):
    """Token-by-token decoding (matvec path) gives the logits of one batched pass (matmul)."""
    ids = smol.tokenizer.encode("One two three four five six", add_bos=False)
    batched = smol_engine.logits(ids)
    smol_engine.reset()
    text = smol_engine.generate(ids, max_new_tokens=1, temperature=0)
    assert smol.tokenizer.encode(text, add_bos=False)[0] == int(batched[-1].argmax())


def test_stream_pieces_join_to_generate(smol_engine):
    kw = dict(max_new_tokens=20, temperature=0.7, seed=3, ignore_eos=True)
    pieces = list(smol_engine.stream("Once upon a time", **kw))
    assert len(pieces) > 1
    assert "".join(pieces) == smol_engine.generate("Once upon a time", **kw)


def test_seeded_sampling_is_reproducible_and_seeds_differ(smol_engine):
    kw = dict(max_new_tokens=24, temperature=1.0, top_k=0, top_p=1.0, ignore_eos=True)
    a = smol_engine.generate("My favourite food is", seed=11, **kw)
    b = smol_engine.generate("My favourite food is", seed=11, **kw)
    c = smol_engine.generate("My favourite food is", seed=12, **kw)
    assert a == b and a != c


def test_prefix_reuse_gives_the_same_text(smol):
    eng = Engine(smol, threads=2)
    first = eng.generate("The capital of France is", max_new_tokens=6, temperature=0)
    # Second call shares the prompt prefix: only the new tokens are computed.
    eng.generate(
        "The capital of France is Paris. The capital of Spain is", max_new_tokens=4, temperature=0
    )
    assert eng.last_stats.prefill_tokens < eng.last_stats.prompt_tokens
    fresh = Engine(smol, threads=1)
    again = fresh.generate(
        "The capital of France is Paris. The capital of Spain is", max_new_tokens=4, temperature=0
    )
    assert eng.generate("The capital of France is", max_new_tokens=6, temperature=0) == first
    assert again  # the fresh engine decodes too
    eng.reset()
    assert (
        eng.generate(
            "The capital of France is Paris. The capital of Spain is",
            max_new_tokens=4,
            temperature=0,
        )
        == again
    )


def test_stop_string_ends_generation(smol_engine):
    full = smol_engine.generate("1, 2, 3, 4,", max_new_tokens=12, temperature=0, ignore_eos=True)
    assert " 6" in full
    cut = smol_engine.generate("1, 2, 3, 4,", max_new_tokens=12, temperature=0, stop=[" 6"])
    assert cut == full[: full.index(" 6")]
    assert smol_engine.last_stats.finish_reason == "stop"


def test_chat_uses_the_models_template(smol_engine):
    prompt = smol_engine.format_chat([{"role": "user", "content": "Hi"}])
    assert prompt.startswith("<|im_start|>system") and prompt.endswith("<|im_start|>assistant\n")
    reply = smol_engine.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        max_new_tokens=24,
        temperature=0,
    )
    assert "Paris" in reply
    assert "<|im_end|>" not in reply


def test_perplexity_matches_reference_nll(smol, smol_engine):
    ids = smol.tokenizer.encode(TEXT, add_bos=False)[:64]
    ref = reference_logits(smol, ids)
    logz = np.log(np.exp(ref - ref.max(1, keepdims=True)).sum(1)) + ref.max(1)
    nll = (logz[:-1] - ref[np.arange(63), ids[1:]]).mean()
    ppl = smol_engine.perplexity_of_ids(ids, window=64)
    assert abs(ppl - np.exp(nll)) / np.exp(nll) < 1e-3
    assert 1.0 < ppl < 100.0


def test_prefill_extends_the_context_like_scoring(smol, smol_engine):
    """prefill in two pieces ends on the same logits as scoring the whole sequence, and an
    empty piece is a ShapeError."""
    ids = smol.tokenizer.encode("A quick brown fox jumps over", add_bos=True)
    whole = smol_engine.logits(ids)
    smol_engine.reset()
    smol_engine.prefill(ids[:3])
    last = smol_engine.prefill(ids[3:])
    assert last.shape == (smol_engine.config.vocab_size,)
    assert_rows_close(last[None, :], whole[-1:])
    with pytest.raises(ShapeError):
        smol_engine.prefill([])
    smol_engine.reset()


def test_token_stream_steps_logprobs_and_counts(smol_engine):
    prompt = "The capital of France is"
    want = smol_engine.generate(prompt, max_new_tokens=8, temperature=0, ignore_eos=True)
    steps = smol_engine.stream_tokens(
        prompt, max_new_tokens=8, temperature=0, ignore_eos=True, logprobs=3
    )
    got = list(steps)
    assert "".join(s.text for s in got) == want
    assert steps.stats.completion_tokens == len(got) == 8
    assert steps.stats.finish_reason == "length"
    # Greedy: each token is the likeliest, its log p that of a fresh forward pass.
    ids = smol_engine.tokenizer.encode(prompt) + [s.token for s in got]
    logits = smol_engine.logits(ids).astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    n = len(ids) - len(got)
    for k, s in enumerate(got):
        assert s.top_logprobs[0][0] == s.token and len(s.top_logprobs) == 3
        assert s.logprob == pytest.approx(logits[n - 1 + k, s.token] - logz[n - 1 + k], abs=2e-3)


def test_frequency_penalty_breaks_a_greedy_loop(smol_engine):
    kw = dict(max_new_tokens=24, temperature=0, ignore_eos=True)
    plain = smol_engine.stream_tokens("1, 1, 1, 1, 1, 1,", **kw)
    penalised = smol_engine.stream_tokens("1, 1, 1, 1, 1, 1,", frequency_penalty=2.0, **kw)
    a = [s.token for s in plain]
    b = [s.token for s in penalised]
    assert len(set(b)) > len(set(a))


def test_token_ids_are_checked_when_the_stream_is_made(smol_engine):
    from powerinfer_rs.errors import TokenError

    vocab = smol_engine.config.vocab_size
    for bad in ([vocab], [5, -1]):
        with pytest.raises(TokenError, match=f"token id {bad[-1]} is outside"):
            smol_engine.stream_tokens(bad)  # raised here, before the first step


def test_the_continuation_does_not_depend_on_what_the_cache_held(smol):
    # The one-token path rounds differently from a multi-token pass: a prompt must meet the
    # K/V a fresh context computes, whatever earlier calls left in the cache.
    eng = Engine(smol, threads=2)
    prompt = "A short note on bread: it is"
    ids = eng.tokenizer.encode(prompt)
    kw = dict(max_new_tokens=6, temperature=0.9, seed=3, ignore_eos=True, logprobs=0)

    def run() -> list:
        return [(s.token, s.logprob) for s in eng.stream_tokens(ids, **kw)]

    eng.reset()
    want = run()
    before = [
        [ids],  # the same prompt again: all but its last token cached
        [ids[:-1]],  # its last token was a prompt's last (one-token path)
        [ids[:-2]],  # two tokens short: those two would be a one-token pass
        [ids[:3]],  # a prefix, and generated tokens after it
        [ids[:1]],
        [ids + [42, 43]],  # a longer prompt sharing all of it
        [ids[:4], ids[:-1], ids[:2]],
    ]
    for history in before:
        eng.reset()
        for p in history:
            eng.generate(p, max_new_tokens=3, temperature=0)
        assert run() == want, history
    eng.reset()
    eng.prefill(ids[:5])
    assert run() == want
    short = ids[:2]  # a two-token prompt: its first token takes the one-token path when fresh
    eng.reset()
    alone = eng.generate(short, max_new_tokens=4, temperature=0)
    eng.generate(ids, max_new_tokens=2, temperature=0)
    assert eng.generate(short, max_new_tokens=4, temperature=0) == alone
