"""Response bodies shaped as OpenAI's: chat completions and their stream chunks, text
completions, usage, finish reasons and log-probabilities."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..runtime.constrain import Grammar, GrammarError, check_tool_schemas
from ..runtime.reasoning import Splitter
from ..runtime.streaming import TokenStep
from ..runtime.tokenizer import Tokenizer
from ..runtime.tool_formats import ToolFormat
from ..runtime.tool_formats.json_calls import GENERIC
from ..runtime.tools import ToolCall, ToolCallStream, parse_tool_calls, tool_format
from .thinking import split_piece
from .timings import timings
from .worker import Done


@dataclass
class Calls:
    """A chat request's tools: the model may answer with calls of ``tools``; its answer was
    made to start with ``prefix`` (the opening of a required call), which is part of it, and
    continues as ``grammar`` allows (the call's arguments as the tool's schema).
    ``first_only`` (``parallel_tool_calls: false``): the model may write several calls in one
    answer and the parsers read them all, so only the first is returned (calls are returned at
    the answer's end, streamed or not, so none has been sent before). ``fmt``: the family the
    template writes calls in (:mod:`..runtime.tool_formats`)."""

    tools: list[dict[str, Any]]
    prefix: str = ""
    grammar: Grammar | None = None  # the rest of a required call, constrained
    first_only: bool = False
    fmt: ToolFormat = GENERIC
    stream: ToolCallStream = field(init=False)

    def __post_init__(self) -> None:
        self.stream = ToolCallStream(self.tools, self.fmt)
        self.stream.push(self.prefix)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The content and the calls of a whole answer. A call the prompt started (``prefix``)
        that does not parse (cut off by ``max_tokens``) is no content: its text is the inside
        of a call, never shown."""
        content, calls = parse_tool_calls(self.prefix + text, self.tools, self.fmt)
        return ("", []) if self.prefix and not calls else (content, self._kept(calls))

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The streamed answer's end: the content still to show and the calls (see
        :meth:`parse`)."""
        rest, calls = self.stream.finish()
        return ("", []) if self.prefix and not calls else (rest, self._kept(calls))

    def _kept(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls[:1] if self.first_only else calls


def calls_for(
    engine: Any, tools: list[dict[str, Any]], required: bool, named: str | None, param: str
) -> Calls:
    """How an answer with OpenAI-style ``tools`` starts: free (the model may call one), or,
    when a call is ``required`` or one is ``named``, as a call in the template's family
    (:func:`~..runtime.tools.tool_format`) started in the prompt, its arguments constrained to
    the tool's schema; a family whose calls cannot be started (a template rendering its own
    JSON convention) leaves them to the model. A ``named`` tool that is not among ``tools``
    is a 400 on ``param``, and so is a tool no call could satisfy (its parameters have no
    finite instance: :func:`~..runtime.constrain.check_tool_schemas`) whatever the choice,
    before anything is generated."""
    from .errors import APIError

    try:
        check_tool_schemas(tools)
    except GrammarError as e:
        raise APIError(400, str(e), param="tools", code="invalid_schema") from None
    names = [t["function"]["name"] for t in tools]
    if named is not None and named not in names:
        raise APIError(
            400,
            f"{param} names the tool '{named}', which is not among the tools ({names})",
            param=param,
        )
    fmt = tool_format(engine.loaded.chat_template)
    if fmt.force is None or (named is None and not required):
        return Calls(tools, fmt=fmt)
    prefix, grammar = fmt.force(tools, named)
    return Calls(tools, prefix, grammar, fmt=fmt)


def split_with(think: Splitter, text: str) -> tuple[str, str]:
    """``(reasoning, content)`` of a whole answer by a fresh splitter like ``think``."""
    s = think.fresh()
    r1, c1 = s.push(text)
    r2, c2 = s.finish()
    return r1 + r2, c1 + c2


#: The engine's finish reasons as OpenAI's.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def finish_reason(done: Done) -> str:
    return FINISH_REASONS.get(done.finish_reason, "stop")


def usage(done: Done) -> dict[str, int]:
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: vocabulary character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenText:
    """Text and bytes of single tokens, as the log-probability entries show them."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token)
        if hit is None:
            text = self._tok.decode([token])
            piece = self._tok.id_to_token(token)
            table = _byte_decoder()
            if "\ufffd" in text and all(c in table for c in piece):  # part of a character
                raw = [table[c] for c in piece]
            else:
                raw = list(text.encode("utf-8"))
            hit = self._cache[token] = (text, raw)
        return hit


class Envelope:
    """The fields every body of one request shares: id, object, created, model."""

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def body(self, obj: str, choices: list, extra: dict | None = None) -> dict[str, Any]:
        out = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if extra:
            out.update(extra)
        return out


def chat_logprobs(steps: list[TokenStep], text_of: TokenText) -> dict[str, Any]:
    def entry(token: int, lp: float) -> dict[str, Any]:
        text, raw = text_of(token)
        return {"token": text, "logprob": lp, "bytes": raw}

    content = []
    for s in steps:
        if s.token is None or s.logprob is None:
            continue
        item = entry(s.token, s.logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in s.top_logprobs]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(
    steps: list[TokenStep], text_of: TokenText, offset: int = 0
) -> dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    for s in steps:
        if s.token is None or s.logprob is None:
            continue
        text = text_of(s.token)[0]
        tokens.append(text)
        lps.append(s.logprob)
        tops.append({text_of(i)[0]: lp for i, lp in s.top_logprobs})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def full_response(
    env: Envelope,
    text: str,
    steps: list[TokenStep],
    done: Done,
    text_of: TokenText | None,
    calls: Calls | None = None,
    think: Splitter | None = None,
) -> dict[str, Any]:
    """The non-streamed body; with ``think``, the reasoning is ``reasoning_content`` and the
    rest (where tool calls are looked for) ``content``."""
    if env.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if think is not None:
            message["reasoning_content"], text = split_with(think, text)
            message["content"] = text
        reason = finish_reason(done)
        if calls is not None:
            content, made = calls.parse(text)
            message["content"] = content
            if made:
                message["content"] = content or None
                message["tool_calls"] = [c.openai() for c in made]
                reason = "tool_calls"
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": chat_logprobs(steps, text_of) if text_of else None,
            "finish_reason": reason,
        }
        obj = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": completion_logprobs(steps, text_of) if text_of else None,
            "finish_reason": finish_reason(done),
        }
        obj = "text_completion"
    return env.body(obj, [choice], {"usage": usage(done), "timings": timings(done)})


class ChunkMaker:
    """The bodies of a streamed response: one chunk per text piece, a last one with the finish
    reason, and with ``include_usage`` a usage chunk (every chunk then has ``usage: null``)."""

    def __init__(
        self,
        env: Envelope,
        text_of: TokenText | None,
        include_usage: bool,
        calls: Calls | None = None,
        progress: bool = False,
        think: Splitter | None = None,
    ):
        self.think = think
        self.env = env
        self.progress = progress
        self.text_of = text_of
        self.include_usage = include_usage
        self.calls = calls
        self.held: list[TokenStep] = []
        self.offset = 0

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        extra = {"usage": None} if self.include_usage else None
        obj = "chat.completion.chunk" if self.env.chat else "text_completion"
        return self.env.body(obj, [choice], extra)

    def first(self) -> dict[str, Any] | None:
        """The chat stream's opening chunk (the assistant role); none for completions."""
        if not self.env.chat:
            return None
        delta = {"role": "assistant", "content": ""}
        return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def prompt_progress(self, stats: Any) -> dict[str, Any] | None:
        """With ``return_progress``, llama.cpp's ``prompt_progress`` chunk (no choices) once
        the prompt is in: ``total`` prompt tokens, ``cache`` (reused), ``processed`` (all of
        them by then, the reused ones included) and ``time_ms`` (the prefill's). The chunked
        prefill does not report between chunks, so this is the one event."""
        if not self.progress or stats is None:
            return None
        obj = "chat.completion.chunk" if self.env.chat else "text_completion"
        total = stats.prompt_tokens
        extra: dict[str, Any] = {"usage": None} if self.include_usage else {}
        extra["prompt_progress"] = {
            "total": total,
            "cache": stats.cached_tokens,
            "processed": total,
            "time_ms": stats.prefill_seconds * 1000.0,
        }
        return self.env.body(obj, [], extra)

    def text_chunk(self, text: str, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        """A completion chunk of ``text`` (the echoed prompt) with ``logprobs`` as given; the
        next pieces' offsets start after it."""
        self.offset += len(text)
        return self._chunk({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None})

    def piece(self, text: str, steps: list[TokenStep]) -> dict[str, Any] | None:
        """The chunk of ``text``, or None while it is held back (the start of a tool call, or
        of a reasoning tag). Reasoning goes out as ``reasoning_content`` deltas."""
        reasoning, text = split_piece(self.think, self.calls, text)
        if not text and not reasoning:
            self.held += steps
            return None
        steps, self.held = self.held + steps, []
        return self._piece(text, steps, None, reasoning)

    def last(self, text: str, steps: list[TokenStep], done: Done) -> list[dict[str, Any]]:
        """The closing chunks: the text left, the calls (one chunk each), the finish reason;
        the last carries the answer's :func:`~.timings.timings`."""
        out = self._last(text, steps, done)
        out[-1]["timings"] = timings(done)
        return out

    def _last(self, text: str, steps: list[TokenStep], done: Done) -> list[dict[str, Any]]:
        lead: list[dict[str, Any]] = []
        if self.think is not None:
            steps, self.held = self.held + steps, []
            r1, c1 = self.think.push(text)
            r2, c2 = self.think.finish()
            if r1 + r2:
                lead.append(self._piece("", steps, None, r1 + r2))
                steps = []
            text = c1 + c2
        return lead + self._closing(text, steps, done)

    def _closing(self, text: str, steps: list[TokenStep], done: Done) -> list[dict[str, Any]]:
        if self.calls is None:
            return [self._piece(text, steps, finish_reason(done))]
        self.calls.stream.push(text)
        rest, made = self.calls.finish()
        steps = self.held + steps
        if not made:
            return [self._piece(rest, steps, finish_reason(done))]
        out = [self._piece(rest, steps, None)] if rest else []
        for i, call in enumerate(made):
            delta = {"tool_calls": [call.openai(index=i)]}
            if i == 0 and not rest and self.offset == 0:
                delta["content"] = None
            out.append(self._chunk({"index": 0, "delta": delta, "logprobs": None,
                                    "finish_reason": None}))  # fmt: skip
        out.append(self._chunk({"index": 0, "delta": {}, "logprobs": None,
                                "finish_reason": "tool_calls"}))  # fmt: skip
        return out

    def _piece(
        self, text: str, steps: list[TokenStep], reason: str | None, reasoning: str = ""
    ) -> dict[str, Any]:
        if self.env.chat:
            lps = chat_logprobs(steps, self.text_of) if self.text_of and steps else None
            delta = {"content": text} if text or (reason is None and not reasoning) else {}
            if reasoning:
                delta = {"reasoning_content": reasoning, **delta}
            choice = {"index": 0, "delta": delta, "logprobs": lps, "finish_reason": reason}
        else:
            lps = None
            if self.text_of and steps:
                lps = completion_logprobs(steps, self.text_of, self.offset)
            choice = {"index": 0, "text": text, "logprobs": lps, "finish_reason": reason}
        self.offset += len(text)
        return self._chunk(choice)

    def usage(self, done: Done) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        obj = "chat.completion.chunk" if self.env.chat else "text_completion"
        return self.env.body(obj, [], {"usage": usage(done)})
