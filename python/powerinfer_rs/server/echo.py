"""``echo`` on ``/v1/completions``, as OpenAI's legacy API: the prompt's text before the
completion's, and with ``logprobs`` the prompt's tokens in the ``logprobs`` object too (the
first one's logprob null, each later one's the log-softmax of the logits after the tokens
before it), then the generated tokens'. ``max_tokens: 0`` returns the prompt alone: lm-eval's
loglikelihood requests.

The prompt's logits come from one batched pass over the prompt
(:meth:`~..runtime.engine.Engine.logits`, on a fresh context), run by the worker thread as
the job's first step (:class:`EchoStream`), so it waits its turn with every other request
and is deterministic; the generation that follows runs as any other (its slot, its prefix
cache). Streamed, the first chunk carries the prompt's text (and its logprobs when asked):
:func:`echo_chunk`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..runtime.sampling import log_probs
from ..runtime.streaming import TokenStep, TokenStream
from .responses import ChunkMaker, TokenText, completion_logprobs


class PromptLogprobs:
    """The prompt's tokens with their log-probabilities: ``logprob`` and ``top_logprobs`` of
    each, None for the first (nothing precedes it)."""

    def __init__(self, ids: Sequence[int], lps: list[float | None], tops: list[Any]):
        self.ids, self.lps, self.tops = list(ids), lps, tops


def score_prompt(engine: Any, ids: Sequence[int], top: int) -> PromptLogprobs:
    """``ids`` scored in one batched pass: token ``j`` under the logits of position ``j - 1``,
    with the ``top`` likeliest alternatives there."""
    logits = engine.logits(ids)
    lps: list[float | None] = [None]
    tops: list[Any] = [None]
    for j in range(1, len(ids)):
        lp, best = log_probs(logits[j - 1], int(ids[j]), top)
        lps.append(lp)
        tops.append(best)
    return PromptLogprobs(ids, lps, tops)


class EchoStream(TokenStream):
    """``inner``, a request's token stream, after the prompt's pass (:func:`score_prompt`,
    when ``top`` is not None: logprobs were asked for) run at its first step, in the worker's
    thread; ``prompt`` holds the result once the first event is out. ``generate``: False for
    ``max_tokens: 0`` (the stream ends after the pass, "length")."""

    def __init__(self, inner: TokenStream, engine: Any, ids: Sequence[int], top: int | None,
                 generate: bool):  # fmt: skip
        self.inner = inner
        self.prompt: PromptLogprobs | None = None
        self.echoed = ""
        super().__init__(self._run(engine, list(ids), top, generate), inner.stats, inner.cancel)

    def _run(self, engine: Any, ids: list[int], top: int | None, generate: bool
             ) -> Iterator[TokenStep]:  # fmt: skip
        if top is not None:
            self.prompt = score_prompt(engine, ids, top)
        if generate:
            yield from self.inner
        else:
            self.inner.stats.finish_reason = "length"

    def close(self) -> None:
        super().close()
        self.inner.close()


def echo_logprobs(
    prompt: PromptLogprobs, text_of: TokenText, steps: list[TokenStep], offset: int
) -> dict[str, Any]:
    """The ``logprobs`` object of an echoed answer: the prompt's tokens, then the generated
    ones (whose ``text_offset`` starts at ``offset``, the echoed text's length). Prompt
    offsets count back from its end, so a token the tokenizer added before a string prompt
    (a BOS, not in the echoed text) sits at 0 with the first token of the text."""
    tokens = [text_of(i)[0] for i in prompt.ids]
    shift = sum(len(t) for t in tokens) - offset
    offsets, at = [], 0
    for text in tokens:
        offsets.append(max(0, at - shift))
        at += len(text)
    tops = [None if t is None else {text_of(i)[0]: lp for i, lp in t} for t in prompt.tops]
    rest = completion_logprobs(steps, text_of, offset)
    return {
        "tokens": tokens + rest["tokens"],
        "token_logprobs": prompt.lps + rest["token_logprobs"],
        "top_logprobs": tops + rest["top_logprobs"],
        "text_offset": offsets + rest["text_offset"],
    }


def echo_stream(engine: Any, prompt: str | Sequence[int], inner: TokenStream,
                logprobs: int | None, max_tokens: int) -> EchoStream:  # fmt: skip
    """``inner`` (the stream made of ``prompt``) behind the prompt's pass; ``echoed`` is set
    to the text echoed: the prompt as given, or its token ids decoded (runs in a thread: it
    tokenizes)."""
    ids = engine._encode_prompt(prompt)
    stream = EchoStream(inner, engine, ids, logprobs, max_tokens > 0)
    stream.echoed = prompt if isinstance(prompt, str) else engine.tokenizer.decode(ids)
    return stream


def apply_echo(body: dict[str, Any], stream: EchoStream, text_of: TokenText | None,
               steps: list[TokenStep]) -> dict[str, Any]:  # fmt: skip
    """``body`` (a whole text completion) with the prompt's text (``stream.echoed``) before
    its text, and the prompt's tokens in its ``logprobs`` when asked for."""
    echoed = stream.echoed
    choice = body["choices"][0]
    choice["text"] = echoed + choice["text"]
    if text_of is not None and stream.prompt is not None:
        choice["logprobs"] = echo_logprobs(stream.prompt, text_of, steps, len(echoed))
    return body


def echo_chunk(chunks: ChunkMaker, stream: TokenStream) -> dict[str, Any] | None:
    """A streamed echo's first chunk, sent once the prompt's pass is done (at the job's first
    event): the prompt's text and, when asked, its tokens' logprobs; None for a stream without
    ``echo``."""
    if not isinstance(stream, EchoStream):
        return None
    lps = None
    if chunks.text_of is not None and stream.prompt is not None:
        lps = echo_logprobs(stream.prompt, chunks.text_of, [], len(stream.echoed))
    return chunks.text_chunk(stream.echoed, lps)
