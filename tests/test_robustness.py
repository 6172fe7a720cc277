"""Robustness: non-finite weights and logits, one Engine shared by threads and by several
stream() generators, interruption at any point of a call, the chat CLI's history, and typed
argument checks of every public Engine function."""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings

import numpy as np
import pytest

from powerinfer_rs import Engine, cli
from powerinfer_rs.errors import (
    InternalError,
    ModelFileError,
    PlanError,
    PowerInferError,
    ShapeError,
    TokenError,
    UnsupportedError,
)
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime import speculative_step
from powerinfer_rs.runtime.chat import ChatTemplateError, fit_conversation
from powerinfer_rs.runtime.checks import THREADS_CAP_FACTOR, usable_cores
from powerinfer_rs.runtime.sampling import SamplingParams, sample

GREEDY = dict(temperature=0.0, ignore_eos=True)
PROMPTS = [[1, 17, 42, 99, 5], [1, 250, 3, 3, 77, 12, 8], [1, 60, 61]]


@pytest.fixture(scope="module")
def small_path(synth_hf):
    return synth_hf(dtype="f32")


@pytest.fixture(scope="module")
def small(small_path):
    return load_model(small_path)


@pytest.fixture(scope="module")
def fresh(small):
    """``fresh(prompt, n)``: the greedy continuation (token ids as text) a new engine gives."""
    cache: dict = {}

    def run(prompt, n=12):
        key = (tuple(prompt), n)
        if key not in cache:
            cache[key] = Engine(small, threads=1).generate(prompt, max_new_tokens=n, **GREEDY)
        return cache[key]

    return run


# -- 1. non-finite numbers ---------------------------------------------------------------------

#: Bytes of a NaN (or inf) per format, and where in a row they go (values or a block's scale).
POISON = {
    "F32": (np.float32(np.nan).tobytes(), 0),
    "F16": (np.float16(np.inf).tobytes(), 0),
    "BF16": (b"\xc0\x7f", 0),  # bf16 NaN
    "Q8_0": (np.float16(np.nan).tobytes(), 34),  # second block's scale
    "Q4_0": (np.float16(np.inf).tobytes(), 18),
    "Q4_1": (np.float16(np.nan).tobytes(), 20 + 2),  # second block's min
}


def poisoned(path, name: str, row: int):
    """The model at ``path`` with one non-finite value in ``row`` of tensor ``name``."""
    loaded = load_model(path)
    t = loaded.tensors[name]
    bad, offset = POISON[t.dtype]
    data = np.array(t.data, copy=True)
    at = row * t.row_bytes + offset
    data[at : at + len(bad)] = np.frombuffer(bad, np.uint8)
    loaded.tensors[name] = dataclasses.replace(t, data=data)
    return loaded


@pytest.mark.parametrize("dtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
def test_non_finite_gguf_weights_are_refused_at_load_naming_the_tensor(synth_gguf, dtype):
    path = synth_gguf(dtype)
    Engine(load_model(path), threads=1)  # the clean model loads
    with pytest.raises(
        ModelFileError,
        match=r"tensor blk\.1\.ffn_up holds non-finite values "
        r"\(first at row 3\)",
    ):
        Engine(poisoned(path, "blk.1.ffn_up", 3), threads=1)


def test_non_finite_bf16_weights_and_embeddings_are_refused(synth_hf):
    path = synth_hf(dtype="bf16")
    with pytest.raises(ModelFileError, match=r"tensor blk\.0\.attn_k .*row 7"):
        Engine(poisoned(path, "blk.0.attn_k", 7), threads=1)
    with pytest.raises(ModelFileError, match=r"tensor token_embd .*row 250"):
        Engine(poisoned(path, "token_embd", 250), threads=1)


@pytest.fixture(scope="module")
def overflowing(small):
    """Finite weights whose logits overflow float32: the output norm scaled to 3e38."""
    t = small.tensors["output_norm"]
    data = np.full(t.cols, 3.0e38, np.float32).view(np.uint8)
    tensors = {**small.tensors, "output_norm": dataclasses.replace(t, data=data)}
    return Engine(dataclasses.replace(small, tensors=tensors), threads=1)


def test_non_finite_logits_never_reach_sampling(overflowing):
    eng = overflowing
    for kwargs in (dict(temperature=0.8, seed=1), GREEDY):
        with pytest.raises(InternalError, match=r"non-finite logits at position 3 \(token id 4\)"):
            eng.generate([1, 2, 3, 4, 5], max_new_tokens=3, **kwargs)
        assert eng.n_past == len(eng.context_ids) == 0  # the failed feed is rolled back
    with pytest.raises(InternalError, match="non-finite logits"):
        eng.logits([1, 2, 3])
    with pytest.raises(InternalError, match="non-finite logits"):
        eng.prefill([1, 2])


def test_perplexity_never_returns_nan(overflowing):
    with pytest.raises(InternalError, match="non-finite logits"):
        overflowing.perplexity_of_ids([1, 2, 3, 4, 5, 6], window=4)
    assert overflowing.n_past == 0


def test_sample_refuses_non_finite_logits():
    logits = np.zeros(10, np.float32)
    logits[3] = np.nan
    with pytest.raises(ShapeError, match=r"non-finite values \(token ids \[3\]"):
        sample(logits, SamplingParams(temperature=0.7), np.random.default_rng(0))


# -- 3. sharing --------------------------------------------------------------------------------


def test_threads_sharing_one_engine_are_serialised(small, fresh):
    eng = Engine(small, threads=1)
    want = {i: fresh(p) for i, p in enumerate(PROMPTS)}
    got: dict[tuple[int, int], str] = {}
    errors: list[BaseException] = []
    stop_reading = threading.Event()

    def work(w):
        try:
            for r in range(3):
                i = (w + r) % len(PROMPTS)
                got[w, r] = (i, eng.generate(PROMPTS[i], max_new_tokens=12, **GREEDY))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def read():
        try:
            while not stop_reading.is_set():
                assert eng.n_past >= 0 and eng.sparsity == "dense"
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    reader = threading.Thread(target=read)
    for t in [*workers, reader]:
        t.start()
    for t in workers:
        t.join(120)
    stop_reading.set()
    reader.join(10)
    assert not errors, errors
    assert len(got) == 12
    for i, text in got.values():
        assert text == want[i]
    assert eng.n_past == len(eng.context_ids)


def test_interleaved_stream_generators_each_give_their_own_text(small, fresh):
    eng = Engine(small, threads=1)
    gens = [eng.stream(p, max_new_tokens=12, **GREEDY) for p in PROMPTS]
    outs = ["" for _ in PROMPTS]
    live = set(range(len(gens)))
    while live:
        for i in sorted(live):
            try:
                outs[i] += next(gens[i])
            except StopIteration:
                live.discard(i)
        # Other calls between the steps change the context too.
        eng.logits([1, 2, 3])
    assert outs == [fresh(p) for p in PROMPTS]


def test_a_suspended_generator_does_not_block_other_threads(small, fresh):
    eng = Engine(small, threads=1)
    g = eng.stream(PROMPTS[0], max_new_tokens=12, **GREEDY)
    first = next(g)
    result: list[str] = []
    t = threading.Thread(
        target=lambda: result.append(eng.generate(PROMPTS[1], max_new_tokens=12, **GREEDY))
    )
    t.start()
    t.join(60)
    assert not t.is_alive() and result == [fresh(PROMPTS[1])]
    assert first + "".join(g) == fresh(PROMPTS[0])


def test_direct_core_session_calls_from_threads_are_serialised(small):
    # The Engine lock makes Engine calls safe; a bare _core.Session serialises its calls too
    # (no "Already mutably borrowed" while another thread's feed runs without the GIL).
    eng = Engine(small, threads=1)
    from powerinfer_rs import _core

    s = _core.Session(eng.core_model, 1, 256)
    errors: list[BaseException] = []

    def feed():
        try:
            for _ in range(20):
                got = s.feed([1, 2, 3, 4] * 8)  # at most 3 x 32 cached before the resets
                s.reset()
                assert got.shape == (1, small.config.vocab_size) and np.isfinite(got).all()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=feed) for _ in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        assert s.n_past % 32 == 0
    for t in threads:
        t.join(60)
    assert not errors, errors


# -- 4. interruption ---------------------------------------------------------------------------


def interrupt_sampling_at(monkeypatch, k: int) -> None:
    """Make the k-th call of the sampler raise KeyboardInterrupt."""
    real, calls = speculative_step.sample, [0]

    def sampler(*args, **kwargs):
        calls[0] += 1
        if calls[0] == k:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(speculative_step, "sample", sampler)


class FeedInterruptedAfterReturn:
    """A session whose k-th ``feed`` completes in Rust, then raises KeyboardInterrupt, as a
    Ctrl-C arriving just after the call returned would (before Python records the tokens)."""

    def __init__(self, session, k: int):
        self._s, self._k, self._calls = session, k, 0

    def feed(self, *args, **kwargs):
        out = self._s.feed(*args, **kwargs)
        self._calls += 1
        if self._calls == self._k:
            raise KeyboardInterrupt
        return out

    def __getattr__(self, name):
        return getattr(self._s, name)


def assert_consistent_and_fresh(eng, fresh) -> None:
    assert eng.n_past == len(eng.context_ids)
    for p in PROMPTS:
        assert eng.generate(p, max_new_tokens=12, **GREEDY) == fresh(p)


@pytest.mark.parametrize("k", [1, 2, 6])
def test_interrupted_stream_leaves_a_consistent_context(small, fresh, monkeypatch, k):
    eng = Engine(small, threads=1)
    interrupt_sampling_at(monkeypatch, k)
    with pytest.raises(KeyboardInterrupt):
        eng.generate(PROMPTS[0], max_new_tokens=12, **GREEDY)
    monkeypatch.undo()
    assert_consistent_and_fresh(eng, fresh)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_interrupt_between_feed_and_bookkeeping(small, fresh, k):
    eng = Engine(small, threads=1)
    eng.generate(PROMPTS[2], max_new_tokens=3, **GREEDY)
    real = eng.ctx.session
    eng.ctx.session = FeedInterruptedAfterReturn(real, k)
    with pytest.raises(KeyboardInterrupt):
        for _ in eng.stream(PROMPTS[1], max_new_tokens=12, **GREEDY):
            pass
    assert eng.n_past == len(eng.context_ids)
    eng.ctx.session = real
    assert_consistent_and_fresh(eng, fresh)


def test_interrupted_prefill_then_appending_matches_a_fresh_engine(small):
    eng, ref = Engine(small, threads=1), Engine(small, threads=1)
    eng.prefill([1, 5])
    real = eng.ctx.session
    eng.ctx.session = FeedInterruptedAfterReturn(real, 1)
    with pytest.raises(KeyboardInterrupt):
        eng.prefill([7, 8])
    eng.ctx.session = real
    assert eng.n_past == len(eng.context_ids) == 2
    got = eng.prefill([9, 10])
    want = ref.logits([1, 5, 9, 10])[-1]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["logits", "perplexity"])
def test_interrupted_scoring_matches_a_fresh_engine(small, fresh, method):
    eng = Engine(small, threads=1)
    ids = [1, 17, 42, 99, 5, 8, 9]
    want = Engine(small, threads=1).perplexity_of_ids(ids, window=4)
    eng.generate(PROMPTS[0], max_new_tokens=4, **GREEDY)
    real = eng.ctx.session
    eng.ctx.session = FeedInterruptedAfterReturn(real, 2 if method == "perplexity" else 1)
    with pytest.raises(KeyboardInterrupt):
        if method == "logits":
            eng.logits(ids)
        else:
            eng.perplexity_of_ids(ids, window=4)
    eng.ctx.session = real
    assert eng.perplexity_of_ids(ids, window=4) == pytest.approx(want, rel=1e-6)
    assert_consistent_and_fresh(eng, fresh)


def test_generator_closed_early_leaves_a_consistent_context(small, fresh):
    eng = Engine(small, threads=1)
    g = eng.stream(PROMPTS[1], max_new_tokens=12, **GREEDY)
    next(g), next(g)
    g.close()
    assert_consistent_and_fresh(eng, fresh)


def test_smollm2_interrupted_generation_then_same_prompt(smol_path, monkeypatch):
    eng = Engine.from_pretrained(smol_path, threads=2)
    prompt = eng.format_chat([{"role": "user", "content": "Name three colours."}])
    want = eng.generate(prompt, max_new_tokens=10, temperature=0)
    eng.reset()
    interrupt_sampling_at(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        eng.generate(prompt, max_new_tokens=10, temperature=0)
    monkeypatch.undo()
    assert eng.generate(prompt, max_new_tokens=10, temperature=0) == want


# -- the chat CLI ------------------------------------------------------------------------------


def run_chat(
    monkeypatch, eng, lines, argv=("--max-tokens", "6", "--temperature", "0"), interrupt_after=None
):
    """Run ``chat`` on ``eng`` with ``lines`` as the user's input; return the prompts sent.
    With ``interrupt_after=n`` the first reply gets Ctrl-C after its n-th piece."""
    prompts: list[str] = []
    real_stream = eng.stream

    def stream(prompt, **kwargs):
        prompts.append(prompt)
        pieces = real_stream(prompt, **kwargs)
        if interrupt_after is None or len(prompts) > 1:
            return pieces

        def interrupted():
            for i, piece in enumerate(pieces):
                yield piece
                if i + 1 == interrupt_after:
                    raise KeyboardInterrupt

        return interrupted()

    monkeypatch.setattr(eng, "stream", stream)
    monkeypatch.setattr(cli, "_load", lambda a: eng)
    feed = iter(lines)

    def fake_input(prompt=""):
        line = next(feed, None)
        if line is None:
            raise EOFError
        if isinstance(line, BaseException):
            raise line
        return line

    monkeypatch.setattr("builtins.input", fake_input)
    args = cli.build_parser().parse_args(["chat", *argv])
    assert cli.cmd_chat(args) == 0
    return prompts


def test_chat_keeps_its_history_when_a_reply_is_interrupted(small, monkeypatch, capsys):
    eng = Engine(small, threads=1)
    lines = ["hello there", KeyboardInterrupt(), "and again"]
    prompts = run_chat(
        monkeypatch, eng, lines, ("--max-tokens", "20", "--temperature", "0", "--ignore-eos"), 2
    )
    out = capsys.readouterr()
    assert "[interrupted]" in out.err
    assert len(prompts) == 2
    first_reply = out.out.split("\n")[0]
    assert "hello there" in prompts[1] and "and again" in prompts[1]
    assert first_reply and f"assistant\n{first_reply}<|im_end|>" in prompts[1]
    assert eng.n_past == len(eng.context_ids)


def test_chat_drops_the_oldest_turns_when_the_context_fills(small, monkeypatch, capsys):
    eng = Engine(small, threads=1, n_ctx=160)
    lines = [f"turn {i} " + "words and more words " * 2 for i in range(12)]
    prompts = run_chat(monkeypatch, eng, [*lines, "x" * 400, "last one"])
    err = capsys.readouterr().err
    assert "dropped the oldest" in err and "not sent" in err
    assert len(prompts) == 13
    for p in prompts:
        assert len(eng.tokenizer.encode(p)) < eng.n_ctx
    assert "turn 0 " not in prompts[-2] and "turn 11 " in prompts[-2]
    assert "last one" in prompts[-1]


def test_fit_conversation_keeps_the_system_message_and_the_last_turn():
    msgs = [{"role": "system", "content": "s"}]
    for i in range(4):
        msgs += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    msgs.append({"role": "user", "content": "last"})
    kept, dropped = fit_conversation(msgs, lambda m: len(m) <= 4)
    assert dropped == 3 and [m["content"] for m in kept] == ["s", "u3", "a3", "last"]
    kept, dropped = fit_conversation(msgs, lambda m: False)
    assert [m["content"] for m in kept] == ["s", "last"]


# -- 5. argument checks ------------------------------------------------------------------------

BAD_CALLS = [
    ("seed", ShapeError, lambda e: e.generate("x", seed=-1)),
    ("seed", ShapeError, lambda e: e.generate("x", seed="x")),
    ("seed", ShapeError, lambda e: e.generate("x", seed=1.5)),
    ("max_new_tokens", ShapeError, lambda e: e.generate("x", max_new_tokens=2.5)),
    ("max_new_tokens", ShapeError, lambda e: e.stream("x", max_new_tokens="3")),
    ("temperature", ShapeError, lambda e: e.generate("x", temperature="hot")),
    ("top_k", ShapeError, lambda e: e.generate("x", top_k=2.5)),
    ("top_p", ShapeError, lambda e: e.generate("x", top_p=None)),
    ("stop", ShapeError, lambda e: e.generate("x", stop=5)),
    ("stop", ShapeError, lambda e: e.generate("x", stop=["a", None])),
    ("prompt", TokenError, lambda e: e.generate(None)),
    ("token id", TokenError, lambda e: e.prefill([2**70])),
    ("token ids", TokenError, lambda e: e.prefill("abc")),
    ("token ids", TokenError, lambda e: e.logits([1.0, 2.0])),
    ("token ids", TokenError, lambda e: e.perplexity_of_ids([1, None, 3])),
    ("text", ShapeError, lambda e: e.perplexity(None)),
    ("window", ShapeError, lambda e: e.perplexity("a b c d e f", window=3.5)),
    ("window", ShapeError, lambda e: e.perplexity("a b c d e f", window="8")),
    ("sparsity mode", UnsupportedError, lambda e: e.set_sparsity(None)),
    ("thresholds", ShapeError, lambda e: e.start_profiling(thresholds=5)),
    ("plan", PlanError, lambda e: e.load_plan(None)),
    ("plan", PlanError, lambda e: e.gpu_allocation_report(plan=5)),
    ("loaded", ShapeError, lambda e: Engine("model.gguf")),
    ("device", UnsupportedError, lambda e: Engine(e.loaded, device=None)),
    ("n_ctx", ShapeError, lambda e: Engine(e.loaded, n_ctx=16.5)),
    ("threads", ShapeError, lambda e: Engine(e.loaded, threads=1.5)),
    ("threads", ShapeError, lambda e: Engine(e.loaded, threads=-2)),
]


@pytest.mark.parametrize(
    "name,cls,call", BAD_CALLS, ids=[f"{i}-{c[0]}" for i, c in enumerate(BAD_CALLS)]
)
def test_bad_arguments_raise_typed_errors_naming_them(small, name, cls, call):
    eng = Engine(small, threads=1)
    with pytest.raises(cls, match=name):
        call(eng)
    assert eng.n_past == len(eng.context_ids)


def test_from_pretrained_checks_device_and_threads(small_path):
    with pytest.raises(UnsupportedError, match="device"):
        Engine.from_pretrained(small_path, device=None)
    with pytest.raises(ShapeError, match="threads"):
        Engine.from_pretrained(small_path, threads="4")
    with pytest.raises(ModelFileError, match="path"):
        Engine.from_pretrained(5)


def test_threads_far_above_the_cores_are_capped_with_a_warning(small):
    cores = usable_cores()
    with pytest.warns(RuntimeWarning, match="far above"):
        eng = Engine(small, threads=THREADS_CAP_FACTOR * cores + 1)
    assert eng.threads == cores
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Engine(small, threads=cores).threads == cores


def test_numpy_arguments_are_accepted(small, fresh):
    eng = Engine(small, threads=1)
    ids = np.array(PROMPTS[0], dtype=np.int64)
    text = eng.generate(
        ids, max_new_tokens=np.int64(12), seed=np.uint32(3), top_k=np.int32(5), **GREEDY
    )
    assert text == fresh(PROMPTS[0])
    assert math.isfinite(eng.perplexity_of_ids(ids, window=np.int64(4)))


# -- 6. strings that are not text --------------------------------------------------------------

#: A lone surrogate: a Python string no UTF-8 encoder, tokenizer or grammar engine can take.
LONE = "a\ud800b"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
UNENCODABLE_CALLS = [
    ("prompt", TokenError, lambda e: e.generate(LONE, max_new_tokens=1)),
    ("prompt", TokenError, lambda e: list(e.stream(LONE, max_new_tokens=1))),
    ("prompt", TokenError, lambda e: e.stream_tokens(LONE, max_new_tokens=1)),
    ("text", TokenError, lambda e: e.perplexity(LONE + " and more words here")),
    ("text", TokenError, lambda e: e.tokenizer.encode(LONE)),
    ("text", TokenError, lambda e: e.tokenizer.encode(LONE, special=False)),
    ("stop", TokenError, lambda e: e.generate("x", max_new_tokens=1, stop=LONE)),
    (r"stop\[1\]", TokenError, lambda e: e.generate("x", max_new_tokens=1, stop=["a", LONE])),
    (r"messages\[0\].content", ChatTemplateError,
     lambda e: e.chat([{"role": "user", "content": LONE}], max_new_tokens=1)),
    (r"messages\[0\].role", ChatTemplateError,
     lambda e: e.chat([{"role": LONE, "content": "hi"}], max_new_tokens=1)),
    (r"messages\[0\].content", ChatTemplateError,
     lambda e: e.format_chat([{"role": "system", "content": LONE},
                              {"role": "user", "content": ""}])),
    (r"messages\[1\].content\[0\].text", ChatTemplateError,
     lambda e: e.format_chat([{"role": "user", "content": "hi"},
                              {"role": "user", "content": [{"type": "text", "text": LONE}]}])),
    (r"tools\[0\].function.description", ChatTemplateError,
     lambda e: e.format_chat([{"role": "user", "content": "hi"}], tools=[
         {"type": "function", "function": {"name": "f", "description": LONE}}])),
    (r"messages\[1\].tool_calls\[0\].function.arguments", ChatTemplateError,
     lambda e: e.format_chat([{"role": "user", "content": "hi"},
                              {"role": "assistant", "tool_calls": [
                                  {"id": "c1", "function": {"name": "f", "arguments": LONE}}]},
                              {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
                             tools=[TOOL])),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,cls,call",
    UNENCODABLE_CALLS,
    ids=[f"{i}-{c[0]}" for i, c in enumerate(UNENCODABLE_CALLS)],
)
def test_strings_that_are_not_text_are_typed_errors_naming_the_argument(small, name, cls, call):
    """A lone surrogate is refused before tokenizing, as a ValueError-derived PowerInferError
    naming the argument and the character (never the tokenizer's raw TypeError), and the engine
    keeps working."""
    eng = Engine(small, threads=1)
    with pytest.raises(cls, match=name) as e:
        call(eng)
    assert isinstance(e.value, ValueError) and isinstance(e.value, PowerInferError)
    assert "U+D800 at index 1" in str(e.value)
    assert eng.n_past == len(eng.context_ids)
    assert eng.generate([1, 2], max_new_tokens=2, **GREEDY)


def test_token_to_id_of_a_string_that_is_not_text_is_none(small):
    assert small.tokenizer.token_to_id(LONE) is None
