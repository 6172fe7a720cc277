"""Generation for :class:`~.engine.Engine`: sampling tokens one by one, streaming their text,
stop strings, and the timing of the last call (:class:`GenerationStats`)."""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import ContextOverflowError, ShapeError, TokenError
from .chat import format_chat
from .checks import check_int, check_seed
from .constrain import Constraint, Grammar, grammar_of
from .prefix_cache import common_prefix
from .sampling import PositionDraws, SamplingParams, log_probs, sample
from .speculative import (
    DEFAULT_DRAFT_MAX,
    Draft,
    Drafter,
    DraftLength,
    SamplingState,
    accept_or_replace,
    decode_many,
    resolve_speculative,
)
from .streaming import IncrementalDecoder, StopMatcher, TokenStep, TokenStream
from .tokenizer import Tokenizer, check_text

if TYPE_CHECKING:
    from ..loading import LoadedModel


F = TypeVar("F", bound=Callable[..., Any])


def locked(method: F) -> F:
    """Run an Engine method holding the engine's lock; on any exception (KeyboardInterrupt
    included) bring the Python view of the context and the KV cache back into agreement."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except BaseException:
                self._resync()
                raise

    return wrapper  # type: ignore[return-value]


@dataclass
class GenerationStats:
    """Timing of the last generate/stream call."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (the rest came from the cache)
    cached_tokens: int = 0  # prompt tokens reused from the KV cache (or a prefix cache entry)
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    completion_tokens: int = 0  # tokens sampled (an end-of-sequence token not counted)
    finish_reason: str = ""
    stop_sequence: str | None = None  # the stop string that ended it (finish_reason "stop")
    #: With a plan on a GPU device: the decode steps' seconds by phase of the hybrid executor
    #: ({phase: seconds}, see ``Engine.gpu_info()["phases"]``), else None.
    phases: dict[str, float] | None = None
    #: Speculative decoding (:mod:`.speculative`): the mode that ran ("off", "lookup",
    #: "draft", "custom"), the tokens drafted and sent to verification, those accepted, and
    #: the verification steps (forward passes that carried drafts).
    speculative: str = "off"
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / drafted tokens (0 when nothing was drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_verify_step(self) -> float:
        """Tokens each verification step yielded: its accepted drafts plus the one token the
        target always gives (0 without verification steps)."""
        if not self.verify_steps:
            return 0.0
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0


def _texts(steps: TokenStream) -> Iterator[str]:
    """The non-empty texts of ``steps``; closing this generator closes ``steps``."""
    try:
        for step in steps:
            if step.text:
                yield step.text
    finally:
        steps.close()


class Generation:
    """The generation methods of :class:`~.engine.Engine` (which supplies the session, the
    tokenizer and the context bookkeeping)."""

    _session: Any
    _context: list[int]
    _lock: threading.RLock
    _version: int  # bumped whenever the context changes
    _last_prefill_count: int
    _batched: int  # leading context positions computed by multi-token passes
    loaded: LoadedModel
    tokenizer: Tokenizer
    last_stats: GenerationStats
    n_ctx: int
    n_past: int
    _check_ids: Callable[[Sequence[int]], list[int]]
    draft: Any  # the engine's draft model (:class:`~.draft.DraftModel`) or None

    # -- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], **kwargs) -> str:
        """Continue ``prompt`` and return the new text (see :meth:`stream` for arguments). Holds
        the engine's lock for the whole call: other threads wait."""
        with self._lock:
            return "".join(self.stream(prompt, **kwargs))

    def chat(self, messages: list[dict], **kwargs) -> str:
        """Answer a conversation formatted with the model's own chat template."""
        return self.generate(self.format_chat(messages), **kwargs)

    def format_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``, with OpenAI-style
        ``tools`` the model may call (:mod:`.tools`: the template's own way, or a fallback
        system prompt; earlier calls and results in ``messages`` written to match)."""
        from .chat import check_text_args
        from .tools import prompt_messages

        if tools is not None:
            check_text_args(tools, "tools")
        tok = self.tokenizer
        bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.id_to_token(tok.eos_ids[0]) if tok.eos_ids else ""
        template = self.loaded.chat_template
        uses_tools = any(
            isinstance(m, dict) and ("tool_calls" in m or m.get("role") == "tool") for m in messages
        )
        if tools is not None or uses_tools:
            check_text_args(messages, "messages")  # before the calls are written as JSON
            messages, extra = prompt_messages(messages, tools, template)
        else:
            extra = {}
        return format_chat(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=eos or "",
            **extra,
        )

    def stream(self, prompt: str | Sequence[int], **kwargs) -> Iterator[str]:
        """Yield the continuation of ``prompt`` piece by piece as tokens are decoded (the
        non-empty texts of :meth:`stream_tokens`, which see for the arguments).

        Several generators may be alive at once on one engine (in one thread or several): each
        gives its own right text. A step that finds the context changed by another call since
        its own last step first brings the context back to its tokens (reusing the common
        prefix; this costs one prefill of its tokens), so interleaving generators is correct
        but slower than running them one after the other.
        """
        return _texts(self.stream_tokens(prompt, **kwargs))

    def stream_tokens(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        ignore_eos: bool = False,
        logprobs: int | None = None,
        json_schema: dict | bool | None = None,
        grammar: str | Grammar | None = None,
        regex: str | None = None,
        speculative: str | Drafter | None = "auto",
        draft_max: int = DEFAULT_DRAFT_MAX,
    ) -> TokenStream:
        """The continuation of ``prompt`` one sampled token at a time (:class:`TokenStep`).

        ``temperature=0`` is greedy. ``presence_penalty``/``frequency_penalty`` (in [-2, 2])
        lower the logits of tokens already generated, once / per occurrence (OpenAI's rule);
        ``repetition_penalty`` scales those of tokens in the prompt or the output. ``stop``
        strings end generation (they are not yielded). Generation also ends at an
        end-of-sequence token (unless ``ignore_eos``), after ``max_new_tokens``, or when the
        context is full; the stream's ``stats.finish_reason`` then says which ("eos", "stop",
        "length", "context"). ``logprobs=k`` gives each step its log-probability and the ``k``
        likeliest alternatives. Arguments are checked here, before the first step is asked for.

        Constrained decoding (:mod:`.constrain`, llguidance): ``json_schema`` (a JSON schema;
        True: any JSON object), ``grammar`` (llguidance's Lark-like grammar text, which may embed
        JSON schemas with ``%json``) or ``regex``: only tokens the constraint allows are
        sampled, and generation ends ("eos") when it is complete; cut off by
        ``max_new_tokens`` first, it ends with "length" (the output is then incomplete). A
        schema or grammar the engine cannot use is a :class:`~.constrain.GrammarError` naming
        the part.

        Speculative decoding (:mod:`.speculative`): ``speculative="lookup"`` drafts the tokens
        that followed the latest earlier occurrence of the context's last few tokens (text the
        model copies from its prompt or its output), "draft" runs the engine's draft model
        (``Engine.from_pretrained(..., draft=PATH)``), "off" or None neither; "auto" (the
        default) is "draft" when the engine has a draft model, else
        :data:`~.speculative.DEFAULT_SPECULATIVE`. Up to ``draft_max`` drafted tokens (the
        number adapts to how many are accepted) are verified in one forward pass. The output is
        the same, token for token, greedy or sampled: each output position samples with a
        generator of its own, keyed by ``seed`` and the position
        (:class:`~.sampling.PositionDraws`), and a draft is accepted when it is the token that
        position samples (:func:`~.speculative.accept_or_replace`). So a ``seed`` gives one text
        with speculation auto, lookup or off, alone or beside other streams, with the same
        stop, eos, length, logprobs and constraint behaviour. ``stats`` reports the tokens
        drafted and accepted.
        """
        constraint = None
        g = grammar if isinstance(grammar, Grammar) else grammar_of(json_schema, grammar, regex)
        if g is not None:
            constraint = Constraint(g, self.tokenizer, self.config.vocab_size)
        params = SamplingParams(
            temperature, top_k, top_p, repetition_penalty, presence_penalty, frequency_penalty
        )
        params.validate()
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0)
        if logprobs is not None:
            logprobs = check_int("logprobs", logprobs, 0)
        draws = PositionDraws(check_seed(seed))
        if isinstance(stop, str) or stop is None:
            stops = [stop] if stop else []
        elif isinstance(stop, Iterable):
            stops = list(stop)
        else:
            stops = [stop]
        if not all(isinstance(s, str) for s in stops):
            raise ShapeError(f"stop must be a string or a list of strings, got {stop!r}")
        for i, s in enumerate(stops):
            check_text("stop" if isinstance(stop, str) else f"stop[{i}]", s)
        prompt_ids = self._encode_prompt(prompt)
        if len(prompt_ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx}"
            )
        mode, drafter, draft_max = resolve_speculative(
            speculative, draft_max, getattr(self, "draft", None)
        )
        eos = set() if ignore_eos else set(self.tokenizer.eos_ids)
        stats = GenerationStats(prompt_tokens=len(prompt_ids), speculative=mode)
        steps = self._stream(
            prompt_ids,
            params,
            max_new_tokens,
            draws,
            stops,
            eos,
            logprobs,
            stats,
            constraint,
            drafter,
            draft_max,
        )
        return TokenStream(steps, stats)

    def _stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        draws: PositionDraws,
        stops: list[str],
        eos: set[int],
        logprobs: int | None,
        stats: GenerationStats,
        constraint: Constraint | None = None,
        drafter: Drafter | None = None,
        draft_max: int = 0,
    ) -> Iterator[TokenStep]:
        """The generator behind :meth:`stream_tokens`. It holds the lock for each forward pass,
        never across a ``yield``; when another call changed the context since its last step it
        brings the context back to its own tokens (prefix reuse) before the next one.

        With a ``drafter`` (speculative decoding), the token sampled from the last logits is fed
        together with up to k drafted tokens (:func:`~.speculative.decode_many`): the rows give
        the logits after the token and after each draft. The positions are then taken one by
        one as without speculation (eos, constraint, penalties, stop strings, logprobs, the
        length limits), each drafted token accepted or replaced by
        :func:`~.speculative.accept_or_replace` against its position's row. An accepted draft
        is in the cache already: the next position's row is at hand, no forward pass; at the
        first replacement the cache is cut back to the accepted tokens and the replacement is
        fed with the next drafts. ``fed`` is always what the plain loop would have fed, and the
        cache is cut back to it when the generation ends."""
        t0 = time.perf_counter()
        with self._lock:
            self.last_stats = stats
            try:
                logits = self._prefill(prompt_ids)
            except BaseException:
                self._resync()
                raise
            mine = self._version
            stats.prefill_tokens = self._last_prefill_count
            stats.cached_tokens = len(prompt_ids) - self._last_prefill_count
        stats.prefill_seconds = time.perf_counter() - t0

        decoder = IncrementalDecoder(self.tokenizer.decode)
        matcher = StopMatcher(stops)
        seen = list(prompt_ids)
        counts: Counter[int] = Counter()  # output tokens, for the presence/frequency penalties
        fed = list(prompt_ids)  # this generator's context: the tokens behind `logits`
        state = SamplingState(params, draws.generator(), seen, counts, draws)
        length = None
        if drafter is not None:
            # A drafter object given as ``speculative=`` is asked for draft_max tokens every
            # step (its drafts verified as given); lookup and draft models adapt k.
            adaptive = stats.speculative != "custom"
            free = bool(getattr(drafter, "free", False))
            length = DraftLength(draft_max, free=free, adaptive=adaptive)
        guess: int | None = None  # a free drafter's guess at the next token, at a plain step
        rows: np.ndarray | None = None  # the last verification's rows
        draft = Draft([], [])  # being verified: draft.tokens[pos] was drafted for `logits`
        pos = 0
        stats.finish_reason = "length"
        t_decode = time.perf_counter()
        phases0 = self._phase_totals()
        try:
            for i in range(max_new_tokens):
                allowed = logits if constraint is None else constraint.mask(logits)
                accepted = False
                if pos < len(draft):
                    token, accepted = accept_or_replace(allowed, draft.tokens[pos], state, i)
                    if accepted:
                        stats.accepted_tokens += 1
                        if pos + 1 == len(draft) and length is not None:
                            length.update(len(draft), len(draft))
                    else:
                        if length is not None:
                            length.update(len(draft), pos)
                        mine = self._cut_back(fed, mine, drafter)
                        draft, pos, rows = Draft([], []), 0, None
                else:
                    token = sample(allowed, params, draws.at(i), seen, counts)
                    if guess is not None and length is not None:
                        length.update(1, int(token == guess))
                guess = None
                if token in eos:
                    stats.finish_reason = "eos"
                    break
                if constraint is not None:
                    constraint.consume(token)  # the next mask is computed during the forward pass
                seen.append(token)
                counts[token] += 1
                stats.completion_tokens += 1
                step = TokenStep(token, matcher.push(decoder.add(token)))
                if logprobs is not None:
                    step.logprob, step.top_logprobs = log_probs(logits, token, logprobs)
                yield step
                if matcher.stopped:
                    stats.finish_reason = "stop"
                    stats.stop_sequence = matcher.matched
                    break
                if constraint is not None and constraint.done:
                    stats.finish_reason = "eos"
                    break
                if i + 1 == max_new_tokens:
                    break
                if accepted and rows is not None and pos + 1 < len(rows):  # fed: its row is here
                    fed.append(token)
                    pos += 1
                    logits = rows[pos]
                    stats.decode_tokens += 1
                    stats.decode_seconds = time.perf_counter() - t_decode
                    continue
                if len(fed) >= self.n_ctx:
                    stats.finish_reason = "context"
                    break
                # Drafts: no more than tokens are left, nor than the context's room for what
                # they verify (draft j is checked against the row after draft j-1). A last
                # draft whose own row no later token could use is verified but not fed (if
                # accepted, it is taken as the plain loop takes a sampled token).
                left = max_new_tokens - i - 1
                room = min(self.n_ctx - len(fed), left)
                feed_max = min(self.n_ctx - len(fed) - 1, left - 1)
                state.position = i + 1  # what a drafter proposes now starts there
                with self._lock:
                    try:
                        proposal = Draft([], [])
                        t_pass = time.perf_counter()
                        if length is not None and drafter is not None:
                            want = length.want(self._others_decoding())
                            if want == 0:
                                length.plain_step()
                                if length.free and room > 0:
                                    got = self._propose(drafter, fed + [token], 1, state, None)
                                    guess = got.tokens[0] if got.tokens else None
                            elif room > 0:
                                proposal = self._propose(
                                    drafter, fed + [token], min(want, room), state, constraint
                                )
                        if self._version != mine:  # another call used the context meanwhile
                            logits = self._prefill(fed + [token])
                            proposal, rows, guess = Draft([], []), None, None
                        elif not proposal.tokens:
                            t_feed = time.perf_counter()  # a free guess is not the step's
                            logits = self._session.feed([token])[0]
                            self._context.append(token)
                            self._version += 1
                            rows = None
                            t_pass = t_feed
                            if length is not None:
                                length.timed(1, time.perf_counter() - t_pass)
                        else:
                            ids = [token] + proposal.tokens[:feed_max]
                            rows = decode_many(self._session, ids)
                            self._context.extend(ids)
                            self._version += 1
                            logits = rows[0]
                            if length is not None:
                                length.timed(len(ids), time.perf_counter() - t_pass)
                    except BaseException:
                        self._resync()
                        raise
                    mine = self._version
                draft, pos = proposal, 0
                if proposal.tokens:
                    stats.verify_steps += 1
                    stats.drafted_tokens += len(proposal)
                fed.append(token)
                stats.decode_tokens += 1
                stats.decode_seconds = time.perf_counter() - t_decode
        finally:
            if phases0 is not None:
                phases1 = self._phase_totals() or {}
                stats.phases = {k: v - phases0.get(k, 0.0) for k, v in phases1.items()}
            if draft.tokens:  # drafts past the last token taken may sit in the cache
                self._cut_back(fed, mine, drafter)
        rest = matcher.flush()
        if rest and not matcher.stopped:
            yield TokenStep(None, rest)

    def _others_decoding(self) -> int:
        """Other generations whose decode steps share this one's forward passes (none here;
        a slot of a :class:`~.slots.SlotPool` says how many): speculative drafts then cost
        them too (:meth:`~.speculative.DraftLength.want`)."""
        return 0

    def _propose(
        self,
        drafter: Drafter,
        history: list[int],
        k: int,
        state: SamplingState,
        constraint: Constraint | None,
    ) -> Draft:
        """At most ``k`` drafted tokens continuing ``history``, cut before the first one the
        constraint (at the state after ``history``) does not allow."""
        got = drafter.propose(history, k, state)
        proposal = Draft([int(t) for t in got.tokens[:k]], list(got.q[:k]))
        if constraint is not None and proposal.tokens:
            proposal = proposal.cut(constraint.valid_prefix(proposal.tokens))
        return proposal

    def _cut_back(self, fed: list[int], mine: int, drafter: Drafter | None) -> int:
        """Drop the drafts past ``fed`` from the KV cache and the context (when the context is
        still this generator's, ``mine``) and from the drafter; the context's version after."""
        if drafter is not None:
            drafter.rewind(len(fed))
        with self._lock:
            if self._version != mine:
                return mine
            n = len(fed)
            if self._session.n_past > n:
                self._session.truncate(n)
            del self._context[n:]
            self._batched = min(self._batched, n)
            self._version += 1
            return self._version

    def _phase_totals(self) -> dict[str, float] | None:
        """The hybrid executor's phase totals so far ({phase: seconds}), or None on the CPU."""
        info = self._session.gpu_info()
        return None if info is None else dict(info["phases"]["total"])

    def stats(self) -> dict:
        """Timing of the last generation as a dict."""
        s = self.last_stats
        return {
            "prompt_tokens": s.prompt_tokens,
            "prefill_tokens": s.prefill_tokens,
            "cached_tokens": s.cached_tokens,
            "prefill_seconds": s.prefill_seconds,
            "decode_tokens": s.decode_tokens,
            "decode_seconds": s.decode_seconds,
            "decode_tokens_per_second": s.decode_tokens_per_second,
            "completion_tokens": s.completion_tokens,
            "finish_reason": s.finish_reason,
            "phases": s.phases,
            "speculative": s.speculative,
            "drafted_tokens": s.drafted_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate,
            "verify_steps": s.verify_steps,
            "tokens_per_verify_step": s.tokens_per_verify_step,
        }

    # -- internals -------------------------------------------------------------------------

    def _encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(check_text("prompt", prompt))
        elif isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Iterable):
            raise TokenError(
                f"prompt must be a string or a sequence of token ids, got {type(prompt).__name__}"
            )
        else:
            ids = self._check_ids(prompt)
            # The core checks ids too, but only at the prefill: a stream is checked when made.
            vocab = self.loaded.config.vocab_size
            bad = next((i for i in ids if not 0 <= i < vocab), None)
            if bad is not None:
                raise TokenError(f"token id {bad} is outside the vocabulary 0..{vocab - 1}")
        if not ids:
            if self.tokenizer.bos_id is None:
                raise ShapeError("empty prompt and the model has no BOS token to start from")
            ids = [self.tokenizer.bos_id]
        return ids

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the context to ``ids`` reusing the longest common prefix; return the logits of
        the last token.

        The result never depends on what the cache held: a fresh context computes the tokens
        before the last in one multi-token pass (whose rows do not depend on how the tokens
        are split into passes) and the last one through the one-token (decode) path, which
        rounds differently. So only positions a multi-token pass computed are reused
        (``_batched``: not the last prompt token of an earlier call, nor generated tokens), and
        the tokens computed now before the last are never a single token when a fresh context
        would batch them."""
        n = len(ids)
        # The last token's logits are always recomputed.
        common = min(common_prefix(self._context, ids), n - 1, self._batched)
        if n - 1 < 2:
            common = 0  # a fresh context computes a lone first token by the one-token path too
        elif n - 1 - common == 1:
            common -= 1  # two tokens before the last: one multi-token pass, as when fresh
        self._version += 1
        self._session.truncate(common)
        self._context = self._context[:common]
        self._batched = common
        todo = ids[common:]
        self._last_prefill_count = len(todo)
        if len(todo) > 1:
            self._session.feed(todo[:-1])
            self._context.extend(todo[:-1])
        self._batched = n - 1 if n - 1 >= 2 else 0
        logits = self._session.feed(todo[-1:])[0]
        self._context.append(todo[-1])
        return logits

    def _resync(self) -> None:
        """After an exception: keep the longest state the Python view and the KV cache agree
        on. The Rust side rolls a failed feed back, and the Python view only grows after a feed
        returned, so the cache can only be ahead (an interrupt between the two): cut it back."""
        n = min(self._session.n_past, len(self._context))
        if self._session.n_past != n:
            self._session.truncate(n)
        del self._context[n:]
        self._batched = min(self._batched, n)
        self._version += 1
