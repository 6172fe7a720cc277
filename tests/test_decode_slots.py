"""``_core.decode_slots`` (decode steps of several sessions in one pass) and the KV snapshots of
the prefix cache, at the binding: every row bit-identical to the session's own one-token step,
snapshots restoring the exact cache, and bad calls refused with typed errors, no context moved."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine, _core
from powerinfer_rs.errors import ShapeError, TokenError, UnsupportedError

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away,", "def fib(n):"]


@pytest.fixture(scope="module")
def engine(smol_path):
    return Engine.from_pretrained(str(smol_path), threads=2, n_ctx=512)


def _sessions(engine, k=3, shared=False):
    out = []
    for p in PROMPTS[:k]:
        pool = engine.core_session if shared else None
        s = _core.Session(engine._model, 2, 512, threads_of=pool)
        s.feed(engine.tokenizer.encode(p))
        out.append(s)
    return out


def test_rows_equal_each_session_alone(engine):
    # The slots share the engine's worker threads, as the server's do.
    slots, alone = _sessions(engine, shared=True), _sessions(engine)
    assert all(s.threads == engine.core_session.threads for s in slots)
    for step, toks in enumerate([[[42], [7, 99, 5], [1000]], [[3], [4], [5, 6]]]):
        got = _core.decode_slots(slots, toks)
        for s, r, t, g in zip(slots, alone, toks, got):
            want = r.decode(t) if len(t) > 1 else r.feed(t)
            assert g.shape == (len(t), want.shape[1]) and g.dtype == np.float32
            assert np.array_equal(g, want), f"pass {step}"
            assert s.n_past == r.n_past


def test_snapshot_restores_the_exact_cache(engine):
    a, b = _sessions(engine, 1)[0], _core.Session(engine._model, 2, 512)
    n = a.n_past
    data = a.kv_snapshot(n - 1)
    assert len(data) == (n - 1) * a.kv_snapshot_bytes_per_position
    b.feed([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # overwritten by the restore
    b.kv_restore(data, n - 1)
    assert b.n_past == n - 1
    last = engine.tokenizer.encode(PROMPTS[0])[-1]
    a.truncate(n - 1)
    assert np.array_equal(a.feed([last]), b.feed([last]))
    with pytest.raises(ShapeError):
        b.kv_restore(data[:-2], n - 1)
    with pytest.raises(ShapeError):
        a.kv_snapshot(a.n_past + 1)
    assert b.n_past == n, "a refused restore changes nothing"


def test_bad_calls_are_refused_and_move_nothing(engine, smol_path):
    slots = _sessions(engine, 2)
    before = [s.n_past for s in slots]
    with pytest.raises(ShapeError):
        _core.decode_slots(slots, [[1]])
    with pytest.raises(ShapeError):
        _core.decode_slots([slots[0], slots[0]], [[1], [2]])
    with pytest.raises(ShapeError):
        _core.decode_slots(slots, [[1], []])
    with pytest.raises(TokenError):
        _core.decode_slots(slots, [[1], [10**9]])
    other = Engine.from_pretrained(str(smol_path), threads=2, n_ctx=512)
    with pytest.raises(UnsupportedError):
        _core.decode_slots([slots[0], _core.Session(other._model, 2, 512)], [[1], [2]])
    assert [s.n_past for s in slots] == before
    assert _core.decode_slots([], []) == []
    with pytest.raises(UnsupportedError):
        _core.Session(other._model, threads_of=slots[0])
