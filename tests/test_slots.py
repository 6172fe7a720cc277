"""Parallel slots (runtime/slots.py, runtime/batcher.py) and the prefix cache
(runtime/prefix_cache.py).

Streams running together in a :class:`SlotPool` decode in shared rounds (the batcher's counters
prove it) and each gives, token for token, the greedy text the engine gives it alone: on
synthetic models in every sparse mode and a mixture of experts, with chunked prefill, lookup
drafts and a draft model, and with a constraint on SmolLM2. A stream closed early frees its slot
at once. The prefix cache restores an earlier conversation's prompt KV into another slot with the
same text as without it, and keeps its bytes within the bound (LRU, strict prefixes dropped).
"""

from __future__ import annotations

import threading

import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import UnsupportedError
from powerinfer_rs.loading import load_model
from powerinfer_rs.runtime.batcher import chunks
from powerinfer_rs.runtime.prefix_cache import PrefixCache, common_prefix
from powerinfer_rs.runtime.slots import SlotPool
from powerinfer_rs.runtime.speculative import PromptLookup
from powerinfer_rs.runtime.streaming import GenerationCancelled

from _helpers import small_moe

#: Prompts of different lengths (several prefill chunks of CHUNK tokens for the long ones).
PROMPTS = [
    [3, 17, 41, 99, 150, 7],
    [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
    [200, 201, 2, 9],
    [42] * 3 + list(range(60, 90)),
]
CHUNK = 8
GREEDY = dict(max_new_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def relu(synth_gguf):
    return load_model(synth_gguf(dtype="F32", activation="relu"))


def run_together(pool: SlotPool, prompts, **kw) -> list[str]:
    """Every prompt in a thread of its own, all streams made first, started at once."""
    return run_streams([pool.stream(p, **kw) for p in prompts])


def run_streams(streams) -> list[str]:
    """Every stream's text, each consumed by a thread of its own, started at once."""
    out: list[str | None] = [None] * len(streams)
    go = threading.Barrier(len(streams))

    def run(i: int) -> None:
        go.wait()
        out[i] = "".join(streams[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(o is not None for o in out)
    return out  # type: ignore[return-value]


def alone(eng: Engine, prompts, **kw) -> list[str]:
    return [eng.generate(p, **kw) for p in prompts]


# -- the parts -----------------------------------------------------------------------------------


def test_prefill_chunks_are_never_one_token():
    for n in range(1, 40):
        for size in (2, 3, 8):
            got = chunks(list(range(n)), size)
            assert sum(got, []) == list(range(n))
            assert all(2 <= len(c) <= size + 1 for c in got) or n == 1


def test_prefix_cache_keeps_the_longest_prefixes_within_its_bound():
    cache = PrefixCache(100)
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert cache.insert([1, 2, 3], b"x" * 30)
    assert cache.insert([1, 2, 3, 4, 5], b"x" * 50)  # drops [1, 2, 3], a strict prefix of it
    assert len(cache) == 1 and cache.bytes == 50
    assert not cache.insert([1, 2, 3, 4], b"x" * 40)  # covered by the entry already
    assert not cache.insert([9, 9], b"x" * 101)  # alone over the bound
    assert not cache.insert([9], b"x")  # too short to save anything
    assert cache.insert([7, 8, 9], b"x" * 40)
    entry, n = cache.lookup([1, 2, 3, 4, 9])
    assert entry is not None and entry.tokens == (1, 2, 3, 4, 5) and n == 4
    cache.used(entry, n)  # [1..5] is now the most recently used: [7, 8, 9] goes first
    assert cache.insert([4, 4, 4], b"x" * 30)
    assert cache.bytes <= cache.limit_bytes
    assert cache.lookup([7, 8, 9])[0] is None and cache.lookup([1, 2])[0] is not None
    s = cache.stats()
    assert s["lookups"] == 3 and s["hits"] == 1 and s["hit_tokens"] == 4 and s["entries"] == 2
    assert 0 < s["hit_rate"] < 1


# -- batching ------------------------------------------------------------------------------------


def test_slots_decode_together_and_each_text_is_its_own(relu):
    eng = Engine(relu, threads=2)
    want = alone(eng, PROMPTS, **GREEDY)
    with SlotPool(eng, 4, cache_bytes=0, chunk=CHUNK, gather_s=0.05) as pool:
        # The slots run on the engine's worker threads (no pool per slot).
        assert all(s._core.threads == eng.core_session.threads for s in pool.slots)
        got = run_together(pool, PROMPTS, **GREEDY)
        b = pool.batcher
        assert got == want
        # Rounds over several slots ran, each one decode_slots call that did not fail.
        assert b.shared_rounds > 0 and b.max_slots >= 2 and b.split_rounds == 0, b.stats()
        assert b.rows > b.rounds  # fewer passes than tokens
        long_prompts = sum(len(p) - 1 > CHUNK for p in PROMPTS)
        assert b.prefill_chunks > len(PROMPTS) + long_prompts - 1  # chunked prefill ran
        assert all(s["state"] == "idle" and s["request"] is None for s in pool.info())
        # A second wave on the same slots (each context reused or replaced) is the same again.
        assert run_together(pool, PROMPTS[::-1], **GREEDY) == want[::-1]
    assert eng.batch_generate(PROMPTS, **GREEDY) == want
    assert eng.batch_generate(PROMPTS, parallel=2, **GREEDY) == want  # two wait for a slot


def test_a_new_prompt_is_prefilled_between_the_running_streams_steps(relu):
    eng = Engine(relu, threads=2)
    long = list(range(10, 130))
    with SlotPool(eng, 2, cache_bytes=0, chunk=2) as pool:
        running = pool.stream_tokens(PROMPTS[0], max_new_tokens=10_000, temperature=0,
                                     ignore_eos=True)  # fmt: skip
        next(running)
        stop = threading.Event()

        def keep_decoding() -> None:
            while not stop.is_set():
                next(running)
            running.close()

        t = threading.Thread(target=keep_decoding)
        t.start()
        start = len(pool.batcher.trace)
        try:
            got = pool.generate(long, **GREEDY)
        finally:
            stop.set()
            t.join(30)
        trace = "".join(pool.batcher.trace)[start:]
        first, last = trace.index("p"), trace.rindex("p")
        assert trace.count("p") == len(chunks(long[:-1], 2))  # the prompt before its last token
        assert trace[first:last].count("d") >= 5, trace  # decode rounds ran between the chunks
        assert got == eng.generate(long, **GREEDY)


def _mode_engine(case, relu, synth_gguf):
    if case == "predictor":
        from test_sparsity import random_predictors

        return Engine(
            relu, threads=2, sparsity="predictor", predictors=random_predictors(relu, 16, 3)
        )
    if case == "threshold":
        model = load_model(synth_gguf(dtype="Q8_0", activation="silu", ffn=256, layers=3))
        return Engine(model, threads=2, sparsity="threshold", thresholds=[0.01] * 3)
    if case == "moe":
        model = small_moe(synth_gguf)
        return Engine(model, threads=2)
    return Engine(relu, threads=2, sparsity=case)


@pytest.mark.parametrize("case", ["exact-relu", "predictor", "threshold", "moe"])
def test_every_mode_gives_each_prompt_its_own_text(case, relu, synth_gguf):
    eng = _mode_engine(case, relu, synth_gguf)
    want = alone(eng, PROMPTS, **GREEDY)
    with SlotPool(eng, 4, cache_bytes=0, chunk=CHUNK, gather_s=0.05) as pool:
        assert pool.slots[0]._core.sparsity == eng.sparsity
        assert run_together(pool, PROMPTS, **GREEDY) == want
        assert pool.batcher.shared_rounds > 0 and pool.batcher.split_rounds == 0


class Always:
    """A drafter drafting one token at every step (its drafts verified, seldom accepted)."""

    def propose(self, history, k, state):
        from powerinfer_rs.runtime.speculative import Draft

        return Draft([(history[-1] * 7 + 1) % 300], [None])

    def rewind(self, n):
        pass


def test_a_seed_gives_one_text_beside_other_streams(relu):
    """Sampled with a seed per request: each stream's text, beside the others, with
    speculation off, lookup or a drafter verified at every step, is the one it gives alone
    without speculation."""
    eng = Engine(relu, threads=2)
    kw = dict(max_new_tokens=24, temperature=0.9, top_p=0.95, ignore_eos=True, seed=7)
    want = alone(eng, PROMPTS, speculative="off", **kw)
    with SlotPool(eng, 4, cache_bytes=0, chunk=CHUNK, gather_s=0.05) as pool:
        for mode in ("off", "lookup", Always()):
            assert run_together(pool, PROMPTS, speculative=mode, **kw) == want, mode
        assert pool.batcher.shared_rounds > 0
        assert all(s.last_stats.drafted_tokens > 0 for s in pool.slots)  # Always's ran last


def test_speculative_decoding_runs_per_slot(relu, synth_gguf):
    other = load_model(synth_gguf(dtype="F32", activation="relu", seed=7))
    eng = Engine(relu, threads=2, draft=other)
    for mode in ("lookup", "draft"):
        kw = dict(GREEDY, speculative=mode, draft_max=4)
        want = alone(eng, PROMPTS, **kw)
        with SlotPool(eng, 4, cache_bytes=0, chunk=CHUNK, gather_s=0.05) as pool:
            assert run_together(pool, PROMPTS, **kw) == want
            if mode == "draft":  # each slot drafts in a context of its own
                assert len({id(s.draft) for s in pool.slots} - {id(eng.draft)}) == 4
            # Whether a slot drafts beside others is the policy's call (DraftLength.want's
            # others): verification inside shared rounds is the next test's.
            assert all(s.last_stats.speculative == mode for s in pool.slots)


def test_verification_rows_share_the_rounds(relu):
    """Drafters that draft every step (objects of the caller's, no policy; one per stream):
    their several-token verification rows go into the shared rounds, and every text is the
    text without speculation."""
    eng = Engine(relu, threads=2)
    want = alone(eng, PROMPTS, **GREEDY, speculative="off")
    with SlotPool(eng, 4, cache_bytes=0, chunk=CHUNK, gather_s=0.05) as pool:
        kw = dict(GREEDY, draft_max=3)
        assert (
            run_streams([pool.stream(p, speculative=PromptLookup(), **kw) for p in PROMPTS]) == want
        )
        assert pool.batcher.shared_verify_rows > 0 and pool.batcher.split_rounds == 0


def test_constrained_decoding_runs_per_slot(smol):
    eng = Engine(smol, threads=2)
    asks = [eng.format_chat([{"role": "user", "content": c}]) for c in ("Weather?", "Rain?")]
    kw = dict(max_new_tokens=12, temperature=0, regex=r"(sunny|rainy), [0-9]{2} C")
    want = alone(eng, asks, **kw)
    with SlotPool(eng, 2, cache_bytes=0, gather_s=0.05) as pool:
        assert run_together(pool, asks, **kw) == want


def test_a_closed_stream_frees_its_slot_at_once(relu):
    eng = Engine(relu, threads=2)
    with SlotPool(eng, 1, cache_bytes=0) as pool:
        steps = pool.stream_tokens(PROMPTS[0], request="r1", **GREEDY)
        next(steps)
        assert pool.info()[0]["state"] == "decode" and pool.info()[0]["request"] == "r1"
        steps.close()
        assert pool.info()[0]["state"] == "idle" and not pool.busy
        assert pool.generate(PROMPTS[1], **GREEDY) == eng.generate(PROMPTS[1], **GREEDY)


def test_a_cancelled_stream_stops_its_prefill_at_the_next_chunk(relu):
    eng = Engine(relu, threads=2)
    long = list(range(10, 70))
    with SlotPool(eng, 1, cache_bytes=0, chunk=4) as pool:
        steps = pool.stream_tokens(long, **GREEDY)
        got: list[BaseException] = []

        def run() -> None:
            try:
                next(steps)
            except BaseException as e:
                got.append(e)
            finally:
                steps.close()

        t = threading.Thread(target=run)
        with pool.batcher._cv:  # the executor is held: the prefill waits for its first chunk
            t.start()
            while pool.info()[0]["state"] != "prefill":
                t.join(0.01)
            steps.cancel()
        t.join(30)
        assert got and isinstance(got[0], GenerationCancelled)
        assert pool.batcher.prefill_chunks <= 1 and not pool.busy
        assert pool.generate(long, **GREEDY) == eng.generate(long, **GREEDY)


def test_a_pool_refuses_a_hybrid_engine(relu, tmp_path):
    from test_speculative import _plan

    eng = Engine(relu, threads=2, sparsity="exact-relu", plan=_plan(relu, tmp_path),
                 device="gpu-sim")  # fmt: skip
    assert not eng.can_batch
    with pytest.raises(UnsupportedError):
        SlotPool(eng, 2)
    kw = dict(GREEDY, max_new_tokens=6)
    assert eng.batch_generate(PROMPTS[:2], **kw) == alone(eng, PROMPTS[:2], **kw)


# -- the prefix cache ----------------------------------------------------------------------------


def test_a_cached_prefix_is_reused_in_another_slot_with_the_same_text(relu):
    eng = Engine(relu, threads=2)
    base = list(range(10, 70))
    first, second = base + [5, 6], base + [7, 8, 9]
    other = [[250, 251, 252, 253, 254], [240, 241, 242, 243]]
    want = eng.generate(second, **GREEDY)
    with SlotPool(eng, 2, cache_bytes=1 << 20, chunk=CHUNK) as pool:
        pool.generate(first, **GREEDY)  # slot 0; its prompt's KV goes into the cache
        for p in other:  # slot 1, then slot 0 again: no slot holds `base` any more
            pool.generate(p, **GREEDY)
        assert all(s.reusable(second) == 0 for s in pool.slots)
        assert pool.generate(second, **GREEDY) == want
        cache = pool.stats()["prefix_cache"]
        assert cache["hits"] == 1 and cache["hit_tokens"] >= len(base) - 1, cache
        assert max(s.last_stats.cached_tokens for s in pool.slots) >= len(base) - 1
        assert cache["bytes"] <= cache["limit_bytes"]


def test_the_cache_stays_within_its_bound(relu):
    eng = Engine(relu, threads=2)
    per_token = eng.new_session().kv_snapshot_bytes_per_position
    prompts = [list(range(start, start + 30)) for start in (10, 100, 150, 200)]
    # Room for two 30-token prompts (29 positions kept of each), not three.
    with SlotPool(eng, 2, cache_bytes=per_token * 70, chunk=CHUNK) as pool:
        for p in prompts:
            pool.generate(p, **GREEDY)
            assert pool.cache.bytes <= pool.cache.limit_bytes
        assert len(pool.cache) == 2 and pool.cache.bytes == 2 * 29 * per_token
    # A prefix larger than the whole bound is never even copied out of the slot.
    with SlotPool(eng, 1, cache_bytes=per_token * 20, chunk=CHUNK) as pool:

        def no_snapshot():
            raise AssertionError("a snapshot that cannot be kept was taken")

        pool.slots[0].snapshot = no_snapshot  # type: ignore[method-assign]
        pool.generate(prompts[0], **GREEDY)
        assert len(pool.cache) == 0
