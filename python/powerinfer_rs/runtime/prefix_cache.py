"""A bounded RAM cache of KV snapshots (llama.cpp's prompt cache): the KV of finished requests'
prompts, so a new request reuses the longest cached prefix of its tokens from any earlier
conversation, in whichever slot it lands.

An entry is a token list and the KV bytes of exactly those positions
(``_core.Session.kv_snapshot``). Only positions computed by multi-token passes are stored (a
slot's ``ctx.ids[:ctx.batched]``), so a restored prefix gives the same logits as computing it
again. Lookup: the entry with the longest common prefix with the new tokens. Insert: entries
that are a strict prefix of the new one are dropped (it covers them); a new one already covered
by an entry only refreshes that entry; the least recently used go until the bytes fit."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

#: The cache's bound by default (``serve --cache-ram``), MiB.
DEFAULT_CACHE_MIB = 2048
#: Entries shorter than this are not kept (a prefix this short saves nothing).
MIN_ENTRY_TOKENS = 2


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens ``a`` and ``b`` share (the usual case, one a prefix of the
    other, compared at C speed)."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Entry:
    """One snapshot: ``tokens`` and the KV bytes of those positions."""

    tokens: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


class PrefixCache:
    """Snapshots within ``limit_bytes`` (0: the cache is off). Thread-safe. Counters:
    ``lookups`` (requests that asked), ``hits`` (those that restored an entry) and
    ``hit_tokens`` (prompt positions the restored entries gave)."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = max(0, int(limit_bytes))
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()  # oldest use first
        self._lock = threading.Lock()
        self.bytes = 0
        self.lookups = self.hits = self.hit_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.limit_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that length ((None, 0) when
        none shares any); counts a lookup."""
        best, best_n = None, 0
        with self._lock:
            self.lookups += 1
            for entry in self._entries.values():
                n = common_prefix(entry.tokens, ids)
                if n > best_n:
                    best, best_n = entry, n
        return best, best_n

    def used(self, entry: Entry, tokens: int) -> None:
        """``entry`` was restored and gives ``tokens`` positions: a hit, and the entry becomes
        the most recently used."""
        with self._lock:
            self.hits += 1
            self.hit_tokens += tokens
            if entry.tokens in self._entries:
                self._entries.move_to_end(entry.tokens)

    def covers(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds ``tokens`` as its prefix already (refreshing it): inserting
        them would add nothing."""
        t = tuple(tokens)
        with self._lock:
            for key in self._entries:
                if len(key) >= len(t) and key[: len(t)] == t:
                    self._entries.move_to_end(key)
                    return True
        return False

    def fits(self, nbytes: int) -> bool:
        return self.enabled and nbytes <= self.limit_bytes

    def insert(self, tokens: Sequence[int], data: bytes) -> bool:
        """Keep the snapshot ``data`` of ``tokens``; whether it was kept (not when the cache is
        off, the tokens are too few, an entry covers them, or it alone exceeds the bound)."""
        t = tuple(tokens)
        if len(t) < MIN_ENTRY_TOKENS or not self.fits(len(data)) or self.covers(t):
            return False
        with self._lock:
            for key in [k for k in self._entries if len(k) < len(t) and t[: len(k)] == k]:
                self.bytes -= self._entries.pop(key).nbytes
            self._entries[t] = Entry(t, bytes(data))
            self.bytes += len(data)
            while self.bytes > self.limit_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.nbytes
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def stats(self) -> dict[str, float | int]:
        """The /health view: entries, bytes, limit_bytes, lookups, hits, hit_rate, hit_tokens."""
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self.bytes,
                "limit_bytes": self.limit_bytes,
                "lookups": self.lookups,
                "hits": self.hits,
                "hit_rate": self.hits / self.lookups if self.lookups else 0.0,
                "hit_tokens": self.hit_tokens,
            }
