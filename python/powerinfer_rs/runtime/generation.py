"""Generation for :class:`~.engine.Engine`: sampling tokens one by one, streaming their text,
stop strings, and the timing of the last call (:class:`GenerationStats`)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ContextOverflowError, ShapeError, TokenError
from .chat import format_chat
from .checks import check_int, check_seed
from .constrain import Constraint, Grammar, grammar_of
from .context import Claim, Context
from .harmony_constraint import HARMONY_START, in_final_channel
from .reasoning import ChatReply, reasoning_start, reply_of
from .reasoning_constraint import AfterReasoning
from .sampling import PositionDraws, SamplingParams
from .speculative import DEFAULT_DRAFT_MAX, Drafter, resolve_speculative
from .speculative_step import SpeculativeStep
from .stream_args import Output, StreamArgs
from .streaming import TokenStep, TokenStream
from .tokenizer import Tokenizer, check_text

if TYPE_CHECKING:
    from ..loading import LoadedModel


F = TypeVar("F", bound=Callable[..., Any])


def locked(method: F) -> F:
    """Run an Engine method holding the engine's lock; on any exception (KeyboardInterrupt
    included) bring the Python view of the context and the KV cache back into agreement."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.ctx.guarded():
            return method(self, *args, **kwargs)

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
        """Decoded tokens per second of decoding (0 before any)."""
        return _per_second(self.decode_tokens, self.decode_seconds)

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prefilled tokens per second of prefill (0 before any)."""
        return _per_second(self.prefill_tokens, self.prefill_seconds)


def _per_second(n: int, seconds: float) -> float:
    """``n`` per second over ``seconds`` (0 for no time)."""
    return n / seconds if seconds > 0 else 0.0


#: The keys of :meth:`Generation.stats`: the :class:`GenerationStats` fields and rates, in order.
STATS_KEYS = (
    "prompt_tokens",
    "prefill_tokens",
    "cached_tokens",
    "prefill_seconds",
    "decode_tokens",
    "decode_seconds",
    "decode_tokens_per_second",
    "completion_tokens",
    "finish_reason",
    "phases",
    "speculative",
    "drafted_tokens",
    "accepted_tokens",
    "acceptance_rate",
    "verify_steps",
    "tokens_per_verify_step",
)


def _texts(steps: TokenStream) -> Iterator[str]:
    """The non-empty texts of ``steps``; closing this generator closes ``steps``."""
    try:
        for step in steps:
            if step.text:
                yield step.text
    finally:
        steps.close()


class Generation:
    """The generation methods of :class:`~.engine.Engine` and of a slot (:mod:`.slots`), which
    supply the context (``ctx``, a :class:`~.context.Context`), the model and its tokenizer."""

    ctx: Context  # the context it generates in
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
        with self.ctx.lock:
            return "".join(self.stream(prompt, **kwargs))

    def chat(
        self,
        messages: list[dict],
        *,
        reasoning_format: str = "auto",
        template_kwargs: dict | None = None,
        **kwargs,
    ) -> ChatReply:
        """Answer a conversation formatted with the model's own chat template. The reply is a
        string, the answer; a ``<think>`` model's reasoning is apart, in its ``reasoning``
        (:class:`~.reasoning.ChatReply`; ``reasoning_format="none"``: all in the string).
        ``template_kwargs`` go to the template (e.g. ``{"enable_thinking": False}``); the
        other arguments are :meth:`stream`'s; a constraint (``json_schema``, ``grammar``,
        ``regex``) binds the answer after the reasoning."""
        prompt = self.format_chat(messages, template_kwargs=template_kwargs)
        kwargs.setdefault(
            "reasoning", reasoning_start(self.loaded.chat_template, prompt, reasoning_format)
        )
        text = self.generate(prompt, **kwargs)
        return reply_of(self.loaded.chat_template, prompt, text, reasoning_format)

    def format_chat(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> str:
        """The prompt text the model's chat template makes of ``messages``, with OpenAI-style
        ``tools`` the model may call (:mod:`.tools`: the template's own way, or a fallback
        system prompt; earlier calls and results in ``messages`` written to match).
        ``template_kwargs``: more variables for the template (``enable_thinking``,
        ``reasoning_effort``), as ``chat_template_kwargs`` in HF's ``apply_chat_template``.
        An assistant message's ``reasoning_content`` goes to templates that read it
        (:mod:`.reasoning_history`)."""
        from .chat import check_text_args
        from .reasoning_history import past_reasoning
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
        extra = {**(template_kwargs or {}), **extra}
        return format_chat(
            template,
            past_reasoning(messages, template),
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

    def _constraint(self, g: Grammar, reasoning: str | None) -> Any:
        """The constraint of grammar ``g`` for a stream, from where ``reasoning`` says
        (:meth:`stream_tokens`)."""
        if reasoning == HARMONY_START:  # gpt-oss: the grammar opens the final channel
            g, reasoning = in_final_channel(g), None
        constraint: Any = Constraint(g, self.tokenizer, self.config.vocab_size)
        if reasoning is not None:
            constraint = AfterReasoning(constraint, self.tokenizer, reasoning)
        return constraint

    def stream_tokens(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.0,
        typical_p: float = 1.0,
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
        reasoning: str | None = None,
    ) -> TokenStream:
        """The continuation of ``prompt`` one sampled token at a time (:class:`TokenStep`).

        ``temperature=0`` is greedy. After ``top_k``, ``typical_p`` (locally typical sampling,
        1: off), ``top_p`` and ``min_p`` (drop tokens less likely than ``min_p`` times the
        likeliest, 0: off) cut the candidates in llama.cpp's order
        (:func:`~.sampling.distribution`). ``presence_penalty``/``frequency_penalty`` (in [-2, 2])
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
        the part. ``reasoning`` lets a thinking model reason before the constraint binds
        (:mod:`.reasoning_constraint`): "open" (the prompt left a ``<think>`` block open) or
        "allowed" (the model may open one), "harmony" (gpt-oss: analysis messages, then the
        grammar opens the final channel: :mod:`.harmony_constraint`); None: it binds the
        first token.

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
        g = grammar if isinstance(grammar, Grammar) else grammar_of(json_schema, grammar, regex)
        constraint = None if g is None else self._constraint(g, reasoning)
        params = SamplingParams(
            temperature,
            top_k,
            top_p,
            repetition_penalty,
            presence_penalty,
            frequency_penalty,
            min_p=min_p,
            typical_p=typical_p,
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
        args = StreamArgs(
            prompt_ids,
            params,
            max_new_tokens,
            draws,
            stops,
            eos,
            logprobs,
            stats,
            constraint=constraint,
            drafter=drafter,
            draft_max=draft_max,
        )
        steps = self._stream(args)
        return TokenStream(steps, stats)

    def _stream(self, a: StreamArgs) -> Iterator[TokenStep]:
        """The generator behind :meth:`stream_tokens`. It holds the context's lock for each
        forward pass, never across a ``yield``; when another call changed the context since its
        last step it brings the context back to its own tokens (prefix reuse) before the next
        one (``claim``: its tokens and the context's version after its own last pass).

        Each output position takes its token from the last logits (:class:`~.speculative_step.
        SpeculativeStep`: a drafted token accepted or replaced, or a plain sample), ends the
        stream at eos, then yields it (:class:`~.stream_args.Output`: constraint, penalties,
        stop strings, logprobs) and ends it at a stop string, a complete constraint or the
        length limit. The next logits are the last verification's row after an accepted draft
        (no pass), else a forward pass (the token alone, or with the next drafts), unless the
        context is full. The claim's tokens are always what the plain loop would have fed, and
        the cache is cut back to them when the generation ends."""
        ctx, stats, t0 = self.ctx, a.stats, time.perf_counter()
        with ctx.guarded():
            self.last_stats = stats
            logits = ctx.prefill(a.prompt_ids)
            claim = Claim(list(a.prompt_ids), ctx.version)
            stats.prefill_tokens = ctx.last_prefill_count
            stats.cached_tokens = len(a.prompt_ids) - ctx.last_prefill_count
        stats.prefill_seconds = time.perf_counter() - t0
        out = Output(a, self.tokenizer.decode)
        spec = SpeculativeStep.of(ctx, a, self.n_ctx)
        stats.finish_reason = "length"
        t_decode = time.perf_counter()
        phases0 = self._phase_totals()
        try:
            for i in range(a.max_new_tokens):
                allowed = logits if a.constraint is None else a.constraint.mask(logits)
                token = spec.take(allowed, out.state, i, claim)
                if token in a.eos:
                    stats.finish_reason = "eos"
                    break
                yield out.push(token, logits)
                if out.finished(i):
                    break
                row = spec.row_after(token, claim)
                if row is None:
                    if len(claim.tokens) >= self.n_ctx:
                        stats.finish_reason = "context"
                        break
                    row = spec.forward(token, i, claim, out.state, self._others_decoding)
                logits = row
                stats.decode_tokens += 1
                stats.decode_seconds = time.perf_counter() - t_decode
        finally:
            if phases0 is not None:
                phases1 = self._phase_totals() or {}
                stats.phases = {k: v - phases0.get(k, 0.0) for k, v in phases1.items()}
            spec.close(claim)
        rest = out.rest()
        if rest is not None:
            yield rest

    def _others_decoding(self) -> int:
        """Other generations whose decode steps share this one's forward passes (none here;
        a slot of a :class:`~.slots.SlotPool` says how many): speculative drafts then cost
        them too (:meth:`~.speculative.DraftLength.want`)."""
        return 0

    def _phase_totals(self) -> dict[str, float] | None:
        """The hybrid executor's phase totals so far ({phase: seconds}), or None on the CPU."""
        info = self.ctx.session.gpu_info()
        return None if info is None else dict(info["phases"]["total"])

    def stats(self) -> dict:
        """Timing of the last generation as a dict (:data:`STATS_KEYS`)."""
        s = self.last_stats
        return {k: getattr(s, k) for k in STATS_KEYS}

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
