"""The executor of a :class:`~.slots.SlotPool`: one thread runs every slot's forward passes.

A *decode round* is one batched call, ``_core.decode_slots``, over the next token(s) of every
slot waiting for one: the weights are read once for all of them, attention runs per slot over its
own KV cache, and each row is bit-identical to what the slot's session computes alone, so which
slots share a round never changes any text, only the speed. A new prompt's prefill runs between
rounds in chunks (:data:`DEFAULT_CHUNK` tokens), alternating with the rounds, so the running
streams keep flowing while it is computed.

Gather rule: a round runs as soon as every *decoder* (a slot that has asked for a decode step
since it was bound and has not left) has its request in, or when the first request has waited
as long as the last round took (at least :data:`DEFAULT_GATHER_S`), whichever is first. A slot
left out would need a round of its own, so waiting up to a round's time for it never costs
more than it saves; a shorter fixed wait lets slots whose Python side (sampling, the consumer
of the stream) takes longer than it fall out of step for good, each round serving one of them.
A slot busy elsewhere (a slow consumer) delays the others by at most a round's time. After a
prefill chunk the decoders get their turn the same way (the next chunk waits for them as long),
so a long prompt costs each running stream one chunk's time per token, never its whole prefill.
For speed, each stream should be consumed by a thread of its own (one thread stepping two
streams makes every round and chunk wait out the other's turn)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from .. import _core
from ..errors import InternalError, UnsupportedError
from .streaming import GenerationCancelled

log = logging.getLogger("powerinfer_rs.slots")

#: Works the batcher's ``trace`` remembers.
TRACE = 1024

#: Prompt tokens one prefill chunk computes between two decode rounds.
DEFAULT_CHUNK = 128
#: Seconds a decode round waits at least for the decoders still missing after the first
#: request (at most the last round's time otherwise).
DEFAULT_GATHER_S = 0.005


def one_pass(session: Any, tokens: list[int]) -> np.ndarray:
    """The logits ``(len(tokens), vocab)`` of ``tokens`` fed after ``session``'s context as one
    slot's row of a round computes them: a one-token feed, or a decode pass whose rows are
    each what a one-token feed gives (``Session.decode``)."""
    return session.feed(tokens) if len(tokens) == 1 else session.decode(tokens)


def chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    """``ids`` cut into pieces of ``size`` tokens, none of one token (a one-token piece would
    run the one-token path, which rounds differently from a multi-token pass; a fresh prefill
    never does) unless ``ids`` is one token: a lone last token joins the piece before."""
    size = max(2, size)
    out = [list(ids[i : i + size]) for i in range(0, len(ids), size)]
    if len(out) > 1 and len(out[-1]) == 1:
        last = out.pop()
        out[-1] += last
    return out


class _Request:
    """One session's tokens waiting for the executor, and what it answered."""

    __slots__ = ("key", "session", "tokens", "done", "result", "error")

    def __init__(self, key: Hashable, session: Any, tokens: list[int]):
        self.key, self.session, self.tokens = key, session, tokens
        self.done = threading.Event()
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None


class Batcher:
    """The executor thread. :meth:`decode` and :meth:`prefill` block the calling slot's thread
    until its rows are computed; :meth:`leave` when a slot's generation ends. Counters (for
    tests and /health): ``rounds`` (decode rounds), ``rows`` (slot requests they served),
    ``shared_rounds`` (rounds over more than one slot: one ``_core.decode_slots`` call each),
    ``shared_verify_rows`` (requests of several tokens, speculative verifications, in those
    rounds), ``split_rounds`` (of those, rounds whose call failed and ran again slot by slot,
    so that only the slot at fault gets the error), ``max_slots`` (the most in one round),
    ``prefill_chunks``, ``prefill_tokens`` and ``busy_seconds`` (time in rounds and chunks:
    against the wall time, how much of it the executor computed); ``trace``: the kinds of the
    latest works run ("d" a decode round, "p" a prefill chunk), oldest first."""

    def __init__(self, chunk: int = DEFAULT_CHUNK, gather_s: float = DEFAULT_GATHER_S):
        self.chunk = int(chunk)
        self.gather_s = float(gather_s)
        self._cv = threading.Condition()
        self._decodes: list[_Request] = []
        self._prefills: deque[_Request] = deque()
        self._decoders: set[Hashable] = set()
        self._first = 0.0  # when the oldest waiting decode request came
        self._prefill_turn = False
        self._closed = False
        self._last_round_s = 0.0
        self._done_at = 0.0  # when the last work ended
        self.rounds = self.rows = self.shared_rounds = self.split_rounds = self.max_slots = 0
        self.shared_verify_rows = 0
        self.prefill_chunks = self.prefill_tokens = 0
        self.busy_seconds = 0.0
        self.trace: deque[str] = deque(maxlen=TRACE)
        self._thread = threading.Thread(target=self._run, name="powerinfer-slots", daemon=True)
        self._thread.start()

    # -- the slots' side ---------------------------------------------------------------------

    def decode(self, key: Hashable, session: Any, tokens: Sequence[int]) -> np.ndarray:
        """The logits of ``tokens`` after ``session``'s context, computed in the next round;
        ``key`` (the slot) counts as a decoder from now until :meth:`leave`."""
        req = _Request(key, session, list(tokens))
        with self._cv:
            self._check_open()
            self._decoders.add(key)
            if not self._decodes:
                self._first = time.monotonic()
            self._decodes.append(req)
            self._cv.notify_all()
        return self._wait(req)

    def prefill(
        self,
        key: Hashable,
        session: Any,
        tokens: Sequence[int],
        stop: Callable[[], bool] | None = None,
    ) -> np.ndarray:
        """Feed ``tokens`` to ``session`` in chunks between decode rounds; the last chunk's
        logits (those of the last token). ``key`` is no decoder meanwhile. When ``stop()``
        says so before a chunk, :class:`~.streaming.GenerationCancelled` (the session then
        holds the chunks fed so far)."""
        out = None
        with self._cv:
            self._decoders.discard(key)
        for piece in chunks(tokens, self.chunk):
            if stop is not None and stop():
                raise GenerationCancelled("the generation was cancelled during its prefill")
            req = _Request(key, session, piece)
            with self._cv:
                self._check_open()
                self._prefills.append(req)
                self._cv.notify_all()
            out = self._wait(req)
        assert out is not None
        return out

    def decoders_besides(self, key: Hashable) -> int:
        """The decoders other than ``key`` (slots whose steps share the rounds now)."""
        with self._cv:
            return len(self._decoders - {key})

    def leave(self, key: Hashable) -> None:
        """``key``'s generation ended: rounds no longer wait for it."""
        with self._cv:
            self._decoders.discard(key)
            self._cv.notify_all()

    def close(self) -> None:
        """Stop the thread; requests still waiting fail with UnsupportedError."""
        with self._cv:
            self._closed = True
            pending = self._decodes + list(self._prefills)
            self._decodes, self._prefills = [], deque()
            self._cv.notify_all()
        for req in pending:
            req.error = UnsupportedError("the slot pool is closed")
            req.done.set()
        if self._thread is not threading.current_thread():
            self._thread.join(30)

    def stats(self) -> dict[str, float]:
        return {
            "rounds": self.rounds,
            "rows": self.rows,
            "shared_rounds": self.shared_rounds,
            "shared_verify_rows": self.shared_verify_rows,
            "split_rounds": self.split_rounds,
            "max_slots": self.max_slots,
            "prefill_chunks": self.prefill_chunks,
            "prefill_tokens": self.prefill_tokens,
            "busy_seconds": round(self.busy_seconds, 6),
        }

    def _check_open(self) -> None:
        if self._closed:
            raise UnsupportedError("the slot pool is closed")

    @staticmethod
    def _wait(req: _Request) -> np.ndarray:
        try:
            req.done.wait()
        except BaseException:  # an interrupt: the session is in use until the pass ends
            req.done.wait()
            raise
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    # -- the executor thread -----------------------------------------------------------------

    def _next(self) -> tuple[str, list[_Request]] | None:
        """The next work (under the lock): ("decode", requests) or ("prefill", [one chunk]),
        waiting for it; None once closed. After a chunk it is the decoders' turn: a chunk
        waits for them as a round waits for the missing ones (it runs when the wait is over
        and none came)."""
        while not self._closed:
            if self._prefills and (self._prefill_turn or not self._decoders):
                self._prefill_turn = False
                return "prefill", [self._prefills.popleft()]
            if not self._decodes and not self._prefills:
                self._cv.wait()
                continue
            waiting = {r.key for r in self._decodes}
            since = self._first if self._decodes else self._done_at
            left = since + max(self.gather_s, self._last_round_s) - time.monotonic()
            if self._decodes and (self._decoders <= waiting or left <= 0):
                reqs, self._decodes = self._decodes, []
                self._prefill_turn = True
                return "decode", reqs
            if left <= 0:  # no decoder came in time: the chunk goes first
                self._prefill_turn = True
                continue
            self._cv.wait(left)
        return None

    def _run(self) -> None:
        while True:
            with self._cv:
                work = self._next()
            if work is None:
                return
            kind, reqs = work
            self.trace.append(kind[0])
            t0 = time.monotonic()
            try:
                if kind == "decode":
                    self._round(reqs)
                    self._last_round_s = time.monotonic() - t0
                else:
                    self._pass(reqs[0], lambda r: r.session.feed(r.tokens))
                    self.prefill_chunks += 1
                    self.prefill_tokens += len(reqs[0].tokens)
            except BaseException as e:  # a bug here must not leave a slot waiting forever
                log.exception("the slots' executor failed")
                for r in reqs:
                    if not r.done.is_set():
                        r.error = InternalError(f"the slots' executor failed: {e!r}")
                        r.done.set()
            self._done_at = time.monotonic()
            self.busy_seconds += self._done_at - t0

    def _round(self, reqs: list[_Request]) -> None:
        """One batched call over ``reqs``; when it fails, each alone (so only the request at
        fault gets the error: the call changes no session when it fails)."""
        self.rounds += 1
        self.rows += len(reqs)
        self.max_slots = max(self.max_slots, len(reqs))
        self.shared_rounds += len(reqs) > 1
        if len(reqs) > 1:
            self.shared_verify_rows += sum(len(r.tokens) > 1 for r in reqs)
            try:
                results = _core.decode_slots([r.session for r in reqs], [r.tokens for r in reqs])
            except Exception as e:
                self.split_rounds += 1
                log.warning("a batched decode round failed (%s); running its slots one by one", e)
            else:
                if len(results) != len(reqs):
                    raise InternalError(f"decode_slots gave {len(results)} results for {len(reqs)}")
                for r, rows in zip(reqs, results):
                    r.result = np.asarray(rows)
                    r.done.set()
                return
        for r in reqs:
            self._pass(r, lambda q: one_pass(q.session, q.tokens))

    @staticmethod
    def _pass(req: _Request, run: Any) -> None:
        try:
            req.result = np.asarray(run(req))
        except BaseException as e:  # handed to the slot's thread, never lost here
            req.error = e
        req.done.set()
