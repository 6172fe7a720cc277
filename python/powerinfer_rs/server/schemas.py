"""Request bodies of the OpenAI endpoints (pydantic models, validated strictly: a number sent as
a string is refused, not coerced). Top-level fields they do not declare are kept
(``model_extra``) and refused by name unless :mod:`.fields` lists them as no-ops (``user``,
``metadata``, ...); declared fields asking for something the engine does not do
(``logit_bias``, ...) are refused by :func:`unsupported_fields`. Nested parts (messages,
tools) ignore what they do not use."""

# ruff: noqa: UP007, UP045 (pydantic evaluates these annotations at run time; Python 3.9
# cannot evaluate `X | Y`)
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

#: The most top log-probabilities a chat request may ask for (OpenAI's limit; completions: 5).
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
#: Stop strings per request.
MAX_STOPS = 16

NonNegInt = Annotated[int, Field(ge=0)]
#: Speculative decoding per request (an extension, see :mod:`.speculation`).
SpeculativeMode = Literal["auto", "lookup", "draft", "off"]
#: The most tokens a request may have drafted per verification step.
MAX_DRAFT = 64
DraftMax = Annotated[int, Field(ge=0, le=MAX_DRAFT)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class Lenient(BaseModel):
    """A request body or a part of one: fields the engine has no use for are ignored."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(Lenient):
    include_usage: bool = False


class TextPart(Lenient):
    """One part of a message's content given as a list (only text parts are understood)."""

    type: Literal["text"]
    text: str


class FunctionCall(Lenient):
    name: str
    arguments: str = ""


class ToolCallIn(Lenient):
    """A call an assistant message of the history made."""

    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: str
    content: Union[str, list[TextPart], None] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None
    reasoning_content: Optional[str] = None

    def as_template_message(self) -> dict[str, Any]:
        """The dict the chat template gets: role and content (text parts joined), and an
        assistant's ``tool_calls`` and ``reasoning_content`` (its earlier reasoning, for the
        templates that read it: :mod:`~..runtime.reasoning_history`) or a tool result's
        ``tool_call_id`` and ``name``."""
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text for p in content)
        out: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.reasoning_content is not None and self.role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class FunctionSpec(Lenient):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[bool] = None


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: Optional[str] = None
    description: Optional[str] = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(Lenient):
    """``response_format``: text, any JSON object, or JSON following a schema (constrained
    decoding: the output parses and validates). ``{"type": "json_object", "schema": S}`` (a
    llama.cpp extension) is JSON following ``S``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None
    object_schema: Optional[dict[str, Any]] = Field(None, alias="schema")


class SamplingFields(BaseModel):
    """Fields both endpoints share. ``top_k``, ``min_p`` (0: off), ``typical_p`` (1: off),
    ``repetition_penalty`` and ``ignore_eos`` are extensions (llama.cpp's and vLLM's servers
    take them too; pass them with the openai client's ``extra_body``), and so are llama.cpp's
    ``grammar`` (GBNF) and ``json_schema`` (a schema the output follows), ``speculative``
    ("lookup", "draft", "auto", "off") and ``draft_max`` (speculative decoding; default: the
    server's ``--speculative`` and ``--draft-max``). Undeclared fields land in
    ``model_extra`` (see :mod:`.fields`)."""

    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[NonNegInt] = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: NonNegInt = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    typical_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    seed: Optional[NonNegInt] = None
    stop: Union[str, Annotated[list[str], Field(max_length=MAX_STOPS)], None] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    repetition_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    n: Annotated[int, Field(ge=1)] = 1  # one choice per request: n > 1 is refused
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    return_progress: bool = False  # llama.cpp's: a prompt_progress chunk before the first token
    ignore_eos: bool = False
    speculative: Optional[SpeculativeMode] = None
    draft_max: Optional[DraftMax] = None
    grammar: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = None
    # Asked-for features the engine does not have: refused when given a value.
    functions: Optional[Any] = None
    logit_bias: Optional[Any] = None
    response_format: Optional[ResponseFormat] = None

    def engine_kwargs(self, max_new_tokens: int) -> dict[str, Any]:
        """Keyword arguments of :meth:`~powerinfer_rs.Engine.stream_tokens`."""
        return {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "typical_p": self.typical_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "stop": self.stop,
            "ignore_eos": self.ignore_eos,
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: Optional[bool] = None
    max_completion_tokens: Optional[NonNegInt] = None
    logprobs: bool = False
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None  # more template variables
    reasoning_effort: Optional[str] = None  # to the template (gpt-oss reads it)

    @property
    def token_limit(self) -> Optional[int]:
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )

    @property
    def engine_logprobs(self) -> Optional[int]:
        """``logprobs`` of :meth:`~powerinfer_rs.Engine.stream_tokens`: top alternatives."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def active_tools(self) -> Optional[list[dict[str, Any]]]:
        """The tools the model may call (none with ``tool_choice: "none"``), as dicts."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt (a string, a list of one string, or token ids)."""

    prompt: Union[str, list[int], list[str]]
    tools: Optional[Any] = None
    logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)]] = None
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[Annotated[int, Field(ge=1)]] = None

    @property
    def token_limit(self) -> int:
        return 16 if self.max_tokens is None else self.max_tokens  # OpenAI's default

    @property
    def engine_logprobs(self) -> Optional[int]:
        """``logprobs`` of :meth:`~powerinfer_rs.Engine.stream_tokens`: top alternatives."""
        return self.logprobs


def unsupported_fields(req: SamplingFields) -> list[str]:
    """Names of the fields ``req`` sets that ask for something the server does not do."""
    names = ["functions", "logit_bias"]
    if isinstance(req, CompletionRequest):
        names += ["tools", "suffix"]
    return [n for n in names if getattr(req, n)]
