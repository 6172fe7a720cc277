"""One stream's checked arguments (:class:`StreamArgs`, what
:meth:`~.generation.Generation.stream_tokens` hands the generation loop, and a slot's lease on to
its slot) and its output so far (:class:`Output`: the tokens taken, their text, the stop
strings and the end conditions met after each token)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .sampling import PositionDraws, SamplingParams, log_probs
from .speculative import Drafter, SamplingState
from .streaming import IncrementalDecoder, StopMatcher, TokenStep

if TYPE_CHECKING:
    from .constrain import Constraint
    from .generation import GenerationStats


@dataclass
class StreamArgs:
    """The arguments of one generation loop, checked: the prompt's ids, the sampling
    parameters and each position's randomness (``draws``), the output's limit, stop strings and
    end-of-sequence ids, ``logprobs`` alternatives (None: no log-probabilities), the stats it
    fills in, the constraint (or None) and the drafter of speculative decoding (or None) with
    its ``draft_max``."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    draws: PositionDraws
    stops: list[str]
    eos: set[int]
    logprobs: int | None
    stats: GenerationStats
    constraint: Constraint | None = None
    drafter: Drafter | None = None
    draft_max: int = 0


class Output:
    """What a stream has produced: the tokens seen (prompt and output, for the repetition
    penalty) and the output tokens' counts (presence and frequency penalties), kept in
    ``state`` (:class:`~.speculative.SamplingState`), and their text through ``decode``
    watched for the stop strings."""

    def __init__(self, args: StreamArgs, decode: Callable[[Sequence[int]], str]):
        self.args = args
        self.decoder = IncrementalDecoder(decode)
        self.matcher = StopMatcher(args.stops)
        self.seen = list(args.prompt_ids)
        self.counts: Counter[int] = Counter()
        draws = args.draws
        self.state = SamplingState(args.params, draws.generator(), self.seen, self.counts, draws)

    def push(self, token: int, logits: np.ndarray) -> TokenStep:
        """Take ``token`` (sampled from ``logits``): the step to yield."""
        a = self.args
        if a.constraint is not None:
            a.constraint.consume(token)  # the next mask is computed during the forward pass
        self.seen.append(token)
        self.counts[token] += 1
        a.stats.completion_tokens += 1
        step = TokenStep(token, self.matcher.push(self.decoder.add(token)))
        if a.logprobs is not None:
            step.logprob, step.top_logprobs = log_probs(logits, token, a.logprobs)
        return step

    def finished(self, i: int) -> bool:
        """Whether the stream ends after output position ``i`` (a stop string, the constraint
        complete, or ``max_new_tokens``), its ``finish_reason`` set."""
        a, m = self.args, self.matcher
        if m.stopped:
            a.stats.finish_reason, a.stats.stop_sequence = "stop", m.matched
        elif a.constraint is not None and a.constraint.done:
            a.stats.finish_reason = "eos"
        else:
            return i + 1 == a.max_new_tokens
        return True

    def rest(self) -> TokenStep | None:
        """The held-back text at the end (none after a stop string)."""
        rest = self.matcher.flush()
        return TokenStep(None, rest) if rest and not self.matcher.stopped else None
