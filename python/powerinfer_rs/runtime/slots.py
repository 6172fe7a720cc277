"""Parallel slots over one :class:`~.engine.Engine`: up to N generations decode together.

A :class:`Slot` is a context of its own (a ``_core.Session`` over the engine's weights, set up
as the engine's: :meth:`~.engine.Engine.new_session`) that runs the engine's whole generation
loop unchanged (:class:`~.generation.Generation`: sampling, stop strings, constraints,
logprobs, speculative decoding). Its session is a :class:`SlotSession`, which hands the
forward passes to the pool's :class:`~.batcher.Batcher`: every slot's next token goes into one
batched pass, a new prompt's prefill runs in chunks between passes. Since each row is computed
exactly as the slot alone would compute it, a slot's text never depends on what the others do.

:meth:`SlotPool.stream_tokens` takes the arguments of the engine's and checks them at once; the
stream binds a slot at its first step (the idle slot whose context reuses most of the prompt,
or the prefix cache's best entry restored into it, :mod:`.prefix_cache`) and frees it when it
ends, is closed or fails. A pool on a hybrid engine cannot be made (UnsupportedError)."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PowerInferError, UnsupportedError
from .batcher import DEFAULT_CHUNK, DEFAULT_GATHER_S, Batcher
from .context import Context
from .generation import Generation, GenerationStats, _texts
from .prefix_cache import DEFAULT_CACHE_MIB, MIN_ENTRY_TOKENS, PrefixCache
from .stream_args import StreamArgs
from .streaming import TokenStep, TokenStream

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("powerinfer_rs.slots")

#: Slots by default (``serve --parallel``).
DEFAULT_PARALLEL = 4
#: The most slots :func:`batch_generate` opens by default.
MAX_BATCH_SLOTS = 16


class SlotSession:
    """The session a slot's generation loop sees: one-token feeds and decode passes go to the
    batcher's rounds, multi-token feeds (prefill) to its chunks; everything else (truncate,
    n_past, gpu_info, ...) straight to the slot's ``_core.Session``."""

    def __init__(self, slot: Slot, core: Any, batcher: Batcher):
        self._slot, self._core, self._batcher = slot, core, batcher

    def feed(self, tokens: Sequence[int]) -> np.ndarray:
        ids = [int(t) for t in tokens]
        if len(ids) == 1:
            return self.decode(ids)
        self._slot.state = "prefill"
        return self._batcher.prefill(self._slot, self._core, ids, self._slot.cancelled.is_set)

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        self._slot.state = "decode"
        return self._batcher.decode(self._slot, self._core, [int(t) for t in tokens])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)


class _OfEngine(Generation):
    """A :class:`~.generation.Generation` over ``engine``'s model: what the generation loop
    needs of the engine besides a context (the model, tokenizer, context size, id checks)."""

    def _of(self, engine: Engine) -> None:
        self.loaded, self.config, self.tokenizer = engine.loaded, engine.config, engine.tokenizer
        self.n_ctx = engine.n_ctx
        self._check_ids = engine._check_ids


class Slot(_OfEngine):
    """One context of a pool: the engine's generation loop over a session of its own (see the
    module). ``state`` is "idle", "prefill" or "decode"; ``request`` the label of the
    generation it runs (None when idle)."""

    def __init__(self, pool: SlotPool, index: int):
        engine = pool.engine
        self._of(engine)
        self.id = index
        self._core = engine.new_session()
        self._batcher = pool.batcher
        self.ctx = Context(SlotSession(self, self._core, pool.batcher))
        # The engine's draft model, with a context of its own.
        self.draft = engine.draft.fork() if engine.draft is not None else None
        self.last_stats = GenerationStats()
        self.state = "idle"
        self.request: str | None = None
        self.cancelled = threading.Event()  # the running generation's (its lease's)
        self.used = 0  # when it was last released (a tick of the pool's), for LRU ties

    def _others_decoding(self) -> int:
        """The other slots decoding now (their steps share this slot's passes)."""
        return self._batcher.decoders_besides(self)

    @property
    def n_past(self) -> int:
        """Positions in the slot's context (its Python view, read without waiting)."""
        return len(self.ctx.ids)

    def reusable(self, ids: Sequence[int]) -> int:
        """Leading positions of ``ids`` this slot's KV cache holds bit-exactly."""
        return self.ctx.reusable(ids)

    def info(self) -> dict[str, Any]:
        """The /health view of the slot."""
        s = self.last_stats
        return {
            "id": self.id,
            "state": self.state,
            "request": self.request,
            "n_past": self.n_past,
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "completion_tokens": s.completion_tokens,
        }


class _Lease(_OfEngine):
    """One generation's claim on a slot of ``pool``: ``stream_tokens`` checks the arguments
    as the engine's does; the stream binds a slot at its first step and frees it at its end."""

    def __init__(self, pool: SlotPool, request: str | None):
        self._of(pool.engine)
        self._pool, self._request = pool, request
        self.cancelled = threading.Event()
        self.draft = pool.engine.draft

    def _stream(self, args: StreamArgs) -> Iterator[TokenStep]:
        """Generation's ``_stream`` of ``args`` in a slot bound now (the engine's draft model
        replaced by the slot's own context of it)."""
        slot = self._pool.acquire(args.prompt_ids, self._request, self.cancelled)
        try:
            if args.drafter is not None and args.drafter is self.draft:
                args = replace(args, drafter=slot.draft)
            yield from slot._stream(args)
        finally:
            self._pool.release(slot)


class SlotPool:
    """``parallel`` slots over ``engine`` (see the module) and a prefix cache of
    ``cache_bytes`` (0: off). ``chunk``: prefill tokens per chunk; ``gather_s``: how long a
    decode round waits at least for slots still missing. The slots take the engine's settings
    (sparsity mode, KV precision, plan, draft model) as they are when the pool is made. Use as
    a context manager, or :meth:`close`."""

    def __init__(
        self,
        engine: Engine,
        parallel: int = DEFAULT_PARALLEL,
        *,
        cache_bytes: int = DEFAULT_CACHE_MIB << 20,
        chunk: int = DEFAULT_CHUNK,
        gather_s: float = DEFAULT_GATHER_S,
    ):
        if not engine.can_batch:
            raise UnsupportedError(
                f"device={engine.device!r}: a hybrid engine serves one request at a time (no slots)"
            )
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise UnsupportedError(f"parallel must be an integer >= 1, got {parallel!r}")
        self.engine = engine
        self.batcher = Batcher(chunk, gather_s)
        self.cache = PrefixCache(cache_bytes)
        self._cv = threading.Condition()
        self._tick = itertools.count(1)
        self._closed = False
        try:
            self.slots = [Slot(self, i) for i in range(parallel)]
        except BaseException:
            self.batcher.close()
            raise

    @property
    def parallel(self) -> int:
        return len(self.slots)

    def __enter__(self) -> SlotPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the executor; generations still running fail with UnsupportedError."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.batcher.close()

    # -- generation --------------------------------------------------------------------------

    def stream_tokens(self, prompt: str | Sequence[int], *, request: str | None = None, **kwargs):
        """As :meth:`~.engine.Engine.stream_tokens` (the same arguments, checked now), run in
        a slot; ``request`` labels the slot while it runs (/health)."""
        lease = _Lease(self, request)
        stream: TokenStream = lease.stream_tokens(prompt, **kwargs)
        stream.on_cancel = lease.cancelled.set
        return stream

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[str]:
        """The non-empty texts of :meth:`stream_tokens`."""
        return _texts(self.stream_tokens(prompt, **kwargs))

    def generate(self, prompt: str | Sequence[int], **kwargs) -> str:
        """The whole continuation (see :meth:`stream_tokens`); other threads' generations run
        in the other slots meanwhile."""
        return "".join(self.stream(prompt, **kwargs))

    # -- slots -------------------------------------------------------------------------------

    def acquire(
        self,
        ids: Sequence[int],
        request: str | None = None,
        cancelled: threading.Event | None = None,
    ) -> Slot:
        """Bind an idle slot to a generation of ``ids`` (waiting for one): the slot whose
        context reuses most of ``ids`` (then the least recently used), or the prefix cache's
        entry restored into it when that reuses more. ``request`` labels it; ``cancelled``
        stops its prefill between chunks."""
        with self._cv:
            while True:
                if self._closed:
                    raise UnsupportedError("the slot pool is closed")
                idle = [s for s in self.slots if s.state == "idle"]
                if idle:
                    break
                self._cv.wait()
            slot = max(idle, key=lambda s: (s.reusable(ids), -s.used))
            slot.state, slot.request = "prefill", request
            slot.cancelled = cancelled if cancelled is not None else threading.Event()
            slot.last_stats = GenerationStats(prompt_tokens=len(ids))
        if self.cache.enabled:
            try:
                self._reuse_cached(slot, ids)
            except PowerInferError as e:  # the slot starts empty; the request goes on
                log.warning("prefix cache: restoring into slot %d failed: %s", slot.id, e)
        return slot

    def _reuse_cached(self, slot: Slot, ids: Sequence[int]) -> None:
        entry, n = self.cache.lookup(ids)
        usable = min(n, len(ids) - 1)  # the last prompt token is always computed
        if entry is not None and usable > slot.reusable(ids):
            slot.ctx.restore(entry.tokens, entry.data)
            self.cache.used(entry, usable)

    def release(self, slot: Slot) -> None:
        """Free ``slot`` (its generation ended): its reusable prefix goes into the cache."""
        self.batcher.leave(slot)
        try:
            if self._worth_keeping(slot):
                self.cache.insert(*slot.ctx.snapshot())
        except PowerInferError as e:
            log.warning("prefix cache: snapshot of slot %d failed: %s", slot.id, e)
        finally:
            with self._cv:
                slot.state, slot.request, slot.used = "idle", None, next(self._tick)
                self._cv.notify_all()

    def _worth_keeping(self, slot: Slot) -> bool:
        """Whether ``slot``'s reusable prefix would go into the cache (checked before its
        snapshot is copied): long enough, within the bound, and not held by an entry yet."""
        held = slot.ctx.ids[: slot.ctx.batched]
        if not self.cache.enabled or len(held) < MIN_ENTRY_TOKENS:
            return False
        nbytes = len(held) * slot._core.kv_snapshot_bytes_per_position
        return self.cache.fits(nbytes) and not self.cache.covers(held)

    # -- observability -----------------------------------------------------------------------

    def info(self) -> list[dict[str, Any]]:
        """Each slot's /health view."""
        return [s.info() for s in self.slots]

    @property
    def busy(self) -> bool:
        return any(s.state != "idle" for s in self.slots)

    def stats(self) -> dict[str, Any]:
        """The batcher's counters and the prefix cache's."""
        return {"batcher": self.batcher.stats(), "prefix_cache": self.cache.stats()}


def batch_generate(
    engine: Engine,
    prompts: Sequence[str | Sequence[int]],
    *,
    parallel: int | None = None,
    **kwargs,
) -> list[str]:
    """:meth:`~.engine.Engine.batch_generate`: every prompt's stream made first (so every
    argument is checked before anything runs), then run in slots of a pool of ``parallel``
    (default: one per prompt, at most :data:`MAX_BATCH_SLOTS`)."""
    prompts = list(prompts)
    if not prompts:
        return []
    if not engine.can_batch:
        return [engine.generate(p, **kwargs) for p in prompts]
    n = parallel if parallel is not None else min(len(prompts), MAX_BATCH_SLOTS)
    with SlotPool(engine, n, cache_bytes=0) as pool:
        streams = [pool.stream_tokens(p, **kwargs) for p in prompts]
        try:
            with ThreadPoolExecutor(min(n, len(prompts)), "powerinfer-batch") as ex:
                return list(ex.map(lambda s: "".join(_texts(s)), streams))
        finally:
            for s in streams:
                s.close()
