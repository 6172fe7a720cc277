"""One context: a session's KV cache and the Python view of it (:class:`Context`), the state an
:class:`~.engine.Engine`, a :class:`~.slots.Slot` and a :class:`~.draft.DraftModel` each hold
one of; and :class:`Claim`, one generation's hold on a context others may use too."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from .prefix_cache import common_prefix
from .speculative import decode_many


@dataclass
class Claim:
    """One generation's view of a shared :class:`Context`: ``tokens``, the tokens behind its
    logits (what the plain loop has fed), and ``version``, the context's version after its own
    last pass (another call changed the context meanwhile when the two differ)."""

    tokens: list[int]
    version: int


class Context:
    """A session (``_core.Session``, or a slot's :class:`~.slots.SlotSession`) and what the
    Python side knows of its KV cache: ``ids``, the tokens in it; ``version``, bumped whenever
    it changes; ``batched``, the leading positions computed by multi-token passes (the ones a
    new prompt may reuse bit-exactly); ``last_prefill_count``, the tokens the last
    :meth:`prefill` computed; ``lock``, held by every call that touches it.

    Invariant: ``ids`` are the tokens of the cache's first ``len(ids)`` positions, and the cache
    never holds fewer (an interrupt between a feed and its bookkeeping can leave it ahead:
    :meth:`resync` cuts it back)."""

    def __init__(self, session: Any, lock: threading.RLock | None = None):
        self.session = session
        self.ids: list[int] = []
        self.version = 0
        self.batched = 0
        self.last_prefill_count = 0
        self.lock = lock if lock is not None else threading.RLock()

    @contextmanager
    def guarded(self) -> Iterator[None]:
        """Hold the lock; on any exception (KeyboardInterrupt included) :meth:`resync`."""
        with self.lock:
            try:
                yield
            except BaseException:
                self.resync()
                raise

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the context to ``ids`` reusing the longest common prefix; return the logits of
        the last token.

        The result never depends on what the cache held: a fresh context computes the tokens
        before the last in one multi-token pass (whose rows do not depend on how the tokens
        are split into passes) and the last one through the one-token (decode) path, which
        rounds differently. So only positions a multi-token pass computed are reused
        (``batched``: not the last prompt token of an earlier call, nor generated tokens), and
        the tokens computed now before the last are never a single token when a fresh context
        would batch them."""
        n = len(ids)
        # The last token's logits are always recomputed.
        common = min(common_prefix(self.ids, ids), n - 1, self.batched)
        if n - 1 < 2:
            common = 0  # a fresh context computes a lone first token by the one-token path too
        elif n - 1 - common == 1:
            common -= 1  # two tokens before the last: one multi-token pass, as when fresh
        self.version += 1
        self.session.truncate(common)
        self.ids = self.ids[:common]
        self.batched = common
        todo = ids[common:]
        self.last_prefill_count = len(todo)
        if len(todo) > 1:
            self.session.feed(todo[:-1])
            self.ids.extend(todo[:-1])
        self.batched = n - 1 if n - 1 >= 2 else 0
        logits = self.session.feed(todo[-1:])[0]
        self.ids.append(todo[-1])
        return logits

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` in one forward pass (one token: the decode path); the logits of the
        last one. Several tokens after a context all computed by multi-token passes extend
        ``batched``."""
        ids = [int(t) for t in ids]
        self.version += 1
        logits = self.session.feed(ids)[0]
        if len(ids) >= 2 and self.batched == len(self.ids):
            self.batched += len(ids)
        self.ids.extend(ids)
        return logits

    def decode(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` in one decode pass (:func:`~.speculative.decode_many`): row i holds
        the logits after ``ids[i]``, as one-token steps would give them."""
        rows = decode_many(self.session, ids)
        self.ids.extend(int(t) for t in ids)
        self.version += 1
        return rows

    def cut_back(self, n: int) -> None:
        """Keep only the first ``n`` tokens (the KV cache's positions past them are dropped)."""
        n = min(n, len(self.ids))
        if self.session.n_past > n:
            self.session.truncate(n)
        del self.ids[n:]
        self.batched = min(self.batched, n)
        self.version += 1

    def cut_back_claim(self, claim: Claim) -> None:
        """Cut the context back to ``claim``'s tokens when it is still the claim's (no other
        call changed it since), the claim then holding the new version."""
        with self.lock:
            if self.version == claim.version:
                self.cut_back(len(claim.tokens))
                claim.version = self.version

    def reset(self) -> None:
        """Forget every token."""
        self.version += 1
        self.session.reset()
        self.ids = []
        self.batched = 0

    def resync(self) -> None:
        """After an exception: keep the longest state the Python view and the KV cache agree
        on. The Rust side rolls a failed feed back, and the Python view only grows after a feed
        returned, so the cache can only be ahead (an interrupt between the two): cut it back."""
        self.cut_back(min(self.session.n_past, len(self.ids)))

    def reusable(self, ids: Sequence[int]) -> int:
        """Leading positions of ``ids`` the KV cache holds bit-exactly."""
        return min(common_prefix(self.ids, ids), self.batched)

    def snapshot(self) -> tuple[list[int], bytes]:
        """The reusable part of the context: its tokens and their KV bytes."""
        n = self.batched
        return self.ids[:n], self.session.kv_snapshot(n)

    def restore(self, tokens: Sequence[int], data: bytes) -> None:
        """Make the context the snapshot ``data`` of ``tokens`` (all computed by multi-token
        passes); a failure leaves an empty context."""
        self.version += 1
        try:
            self.session.kv_restore(data, len(tokens))
        except BaseException:
            self.session.reset()
            self.ids, self.batched = [], 0
            raise
        self.ids, self.batched = list(tokens), len(tokens)
