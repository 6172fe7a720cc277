"""A chat or completion request made ready to run: its tools, its prompt (the chat template
rendered), its output constraint and its token stream. The chat and text completion routes
and the Responses route (:mod:`.responses_api`, which speaks a chat request) share it."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import PowerInferError
from ..runtime.chat import ChatTemplateError
from ..runtime.constrain import GrammarError
from ..runtime.engine import Engine
from ..runtime.reasoning import Splitter, reasoning_start
from ..runtime.streaming import TokenStream
from .constraints import response_grammar
from .echo import echo_stream
from .errors import APIError, from_engine
from .responses import Calls, calls_for
from .schemas import ChatRequest, CompletionRequest, NamedToolChoice
from .speculation import DEFAULTS, SpeculativeDefaults, speculative_kwargs
from .thinking import splitter_for, template_kwargs, with_call


def tool_setup(engine: Engine, req: ChatRequest) -> Calls | None:
    """The request's tools and how the answer starts (see :class:`~.responses.Calls`); a
    ``tool_choice`` that names no given tool is a 400."""
    tools = req.active_tools
    choice = req.tool_choice
    if choice not in (None, "none", "auto") and not req.tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    if tools is None:
        return None
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    calls = calls_for(engine, tools, choice == "required", named, "tool_choice")
    calls.first_only = req.parallel_tool_calls is False
    return calls


def prepare(
    engine: Engine,
    req: ChatRequest | CompletionRequest,
    defaults: SpeculativeDefaults = DEFAULTS,
    stream_tokens: Callable[..., TokenStream] | None = None,
    reasoning: tuple[str, int] = ("auto", -1),
) -> tuple[TokenStream, Calls | None, Splitter | None]:
    """Check the request against the engine and make its token stream (runs in a thread: it
    renders the chat template and tokenizes; it does not touch the context); ``defaults``: the
    server's speculative decoding options; ``stream_tokens``: what makes the stream (default:
    the engine's own, see :meth:`ServerState.stream_tokens`); ``reasoning``: the server's
    reasoning format and budget (:mod:`.thinking`). Returns the stream, the tools' parser and
    the reasoning splitter (None: the answer is not split)."""
    calls, think = None, None
    if isinstance(req, ChatRequest):
        param = "messages"
        calls = tool_setup(engine, req)
        try:
            prompt: Any = engine.format_chat(
                [m.as_template_message() for m in req.messages],
                tools=None if calls is None else calls.tools,
                template_kwargs=template_kwargs(req, reasoning[1]),
            )
        except ChatTemplateError as e:
            raise APIError(400, str(e), param=e.param or param) from None
        except PowerInferError as e:
            raise from_engine(e, param) from None
        if calls is None or not calls.prefix:  # a started call is no reasoning
            think = splitter_for(engine.loaded.chat_template, prompt, reasoning[0])
        if calls is not None:
            prompt = with_call(prompt, calls.prefix)
        limit = req.token_limit if req.token_limit is not None else engine.n_ctx
    else:
        param, prompt, limit = "prompt", req.prompt, req.token_limit
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: give one prompt per request", param=param)
            prompt = prompt[0]
    grammar, where = response_grammar(req)
    if calls is not None and calls.grammar is not None:
        if grammar is not None:  # a required call's arguments follow the tool's schema
            raise APIError(400, f"{where} cannot constrain an answer that tool_choice makes a "
                           "tool call", param=where)  # fmt: skip
        grammar, where = calls.grammar, "tools"
    kwargs = req.engine_kwargs(limit)
    kwargs.update(speculative_kwargs(engine, req.speculative, req.draft_max, defaults))
    try:
        make = stream_tokens or engine.stream_tokens
        if grammar is not None and where != "tools" and param == "messages":
            # a chat answer's grammar binds after the reasoning (harmony: its final channel)
            kwargs["reasoning"] = reasoning_start(engine.loaded.chat_template, prompt, reasoning[0])
        steps = make(prompt, logprobs=req.engine_logprobs, grammar=grammar, **kwargs)
        if getattr(req, "echo", False):
            steps = echo_stream(engine, prompt, steps, req.engine_logprobs, limit)
        return steps, calls, think
    except GrammarError as e:
        code = "invalid_grammar" if where == "grammar" else "invalid_schema"
        raise APIError(400, str(e), param=where, code=code) from None
    except PowerInferError as e:
        raise from_engine(e, param) from None
