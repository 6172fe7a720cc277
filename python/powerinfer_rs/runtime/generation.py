"""Generation for :class:`~.engine.Engine`: sampling tokens one by one, streaming their text,
stop strings, and the timing of the last call (:class:`GenerationStats`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ContextOverflowError, ShapeError
from .chat import format_chat
from .sampling import SamplingParams, sample
from .streaming import IncrementalDecoder, StopMatcher

if TYPE_CHECKING:
    from ..loading import LoadedModel
    from .tokenizer import Tokenizer


@dataclass
class GenerationStats:
    """Timing of the last generate/stream call."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (the rest came from the cache)
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    finish_reason: str = ""

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0


class Generation:
    """The generation methods of :class:`~.engine.Engine` (which supplies the session, the
    tokenizer and the context bookkeeping)."""

    _session: Any
    _context: list[int]
    _last_prefill_count: int
    loaded: LoadedModel
    tokenizer: Tokenizer
    last_stats: GenerationStats
    n_ctx: int
    n_past: int
    _check_ids: Callable[[Sequence[int]], list[int]]

    # -- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], **kwargs) -> str:
        """Continue ``prompt`` and return the new text (see :meth:`stream` for arguments)."""
        return "".join(self.stream(prompt, **kwargs))

    def chat(self, messages: list[dict], **kwargs) -> str:
        """Answer a conversation formatted with the model's own chat template."""
        return self.generate(self.format_chat(messages), **kwargs)

    def format_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
        tok = self.tokenizer
        bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.id_to_token(tok.eos_ids[0]) if tok.eos_ids else ""
        return format_chat(
            self.loaded.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=eos or "",
        )

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        ignore_eos: bool = False,
    ) -> Iterator[str]:
        """Yield the continuation of ``prompt`` piece by piece as tokens are decoded.

        ``temperature=0`` is greedy. ``stop`` strings end generation (they are not yielded).
        Generation also ends at an end-of-sequence token (unless ``ignore_eos``), after
        ``max_new_tokens``, or when the context is full.
        """
        params = SamplingParams(temperature, top_k, top_p, repetition_penalty)
        params.validate()
        if max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        prompt_ids = self._encode_prompt(prompt)
        if len(prompt_ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx}"
            )
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        rng = np.random.default_rng(seed)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(prompt_ids))
        eos = set() if ignore_eos else set(self.tokenizer.eos_ids)

        t0 = time.perf_counter()
        logits = self._prefill(prompt_ids)
        stats.prefill_tokens = self._last_prefill_count
        stats.prefill_seconds = time.perf_counter() - t0

        decoder = IncrementalDecoder(self.tokenizer.decode)
        matcher = StopMatcher(stops)
        seen = list(prompt_ids)
        stats.finish_reason = "length"
        t_decode = time.perf_counter()
        for i in range(max_new_tokens):
            token = sample(logits, params, rng, seen)
            if token in eos:
                stats.finish_reason = "eos"
                break
            seen.append(token)
            piece = matcher.push(decoder.add(token))
            if piece:
                yield piece
            if matcher.stopped:
                stats.finish_reason = "stop"
                break
            if i + 1 == max_new_tokens:
                break
            if self.n_past >= self.n_ctx:
                stats.finish_reason = "context"
                break
            logits = self._session.feed([token])[0]
            self._context.append(token)
            stats.decode_tokens += 1
            stats.decode_seconds = time.perf_counter() - t_decode
        rest = matcher.flush()
        if rest and not matcher.stopped:
            yield rest

    def stats(self) -> dict:
        """Timing of the last generation as a dict."""
        s = self.last_stats
        return {
            "prompt_tokens": s.prompt_tokens,
            "prefill_tokens": s.prefill_tokens,
            "prefill_seconds": s.prefill_seconds,
            "decode_tokens": s.decode_tokens,
            "decode_seconds": s.decode_seconds,
            "decode_tokens_per_second": s.decode_tokens_per_second,
            "finish_reason": s.finish_reason,
        }

    # -- internals -------------------------------------------------------------------------

    def _encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = self._check_ids(prompt)
        if not ids:
            if self.tokenizer.bos_id is None:
                raise ShapeError("empty prompt and the model has no BOS token to start from")
            ids = [self.tokenizer.bos_id]
        return ids

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the context to ``ids`` reusing the longest common prefix; return the logits of
        the last token."""
        common = 0
        for a, b in zip(self._context, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # always recompute the last token's logits
        self._session.truncate(common)
        self._context = self._context[:common]
        todo = ids[common:]
        self._last_prefill_count = len(todo)
        # The last prompt token always goes through the one-token (decode) path, so the first
        # sampled token does not depend on how much of the prompt was already cached.
        if len(todo) > 1:
            self._session.feed(todo[:-1])
            self._context.extend(todo[:-1])
        logits = self._session.feed(todo[-1:])[0]
        self._context.append(todo[-1])
        return logits
