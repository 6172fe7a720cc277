"""``POST /v1/embeddings``: OpenAI's embeddings endpoint on :meth:`~..runtime.engine.Engine.embed`
(the final hidden states, pooled and L2-normalized as llama-server returns them; the pooling
is the file's ``pooling_type``, mean where it names none, or the server's ``--pooling``).

``input``: a string, a list of strings, a list of token ids or a list of token-id lists;
``encoding_format``: ``float`` (lists of numbers) or ``base64`` (little-endian float32, which
the ``openai`` client asks for by default and decodes). ``dimensions`` (a shorter vector) is
refused by name unless it is the model's width. Empty input, an input longer than the
context and ids outside the vocabulary are 400s naming ``input``."""

# ruff: noqa: UP007, UP045 (pydantic evaluates these annotations at run time; Python 3.9
# cannot evaluate `X | Y`)
from __future__ import annotations

import base64
from typing import Any, Literal, Optional, Union

import anyio
import numpy as np
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import PowerInferError
from .errors import APIError, from_engine, parse_body
from .fields import unknown_field_error
from .routing import api_route, check_key, unknown_model


class EmbeddingsRequest(BaseModel):
    """``POST /v1/embeddings`` (undeclared fields refused by name, as on the chat route)."""

    model_config = ConfigDict(extra="allow")
    model: Optional[str] = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = None


def encoded(v: np.ndarray, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


def inputs_of(req: EmbeddingsRequest) -> list[Any]:
    """The inputs, one per vector (a flat list of ints is one token list)."""
    given = req.input
    if isinstance(given, str):
        given = [given]
    elif given and isinstance(given[0], int):
        given = [given]
    if not given:
        raise APIError(400, "'input' is empty: give a string, strings or token ids", param="input")
    for i, item in enumerate(given):
        if len(item) == 0:
            raise APIError(400, f"input[{i}] is empty", param="input")
    return list(given)


@api_route
async def embeddings(request: Request, state: Any) -> Response:
    check_key(request, state)
    req = parse_body(await request.body(), EmbeddingsRequest)
    if req.model is not None and req.model != state.model_id:
        raise unknown_model(req.model, state)
    unknown = unknown_field_error(req.model_extra or {})
    if unknown is not None:
        raise unknown
    dim = state.engine.config.dim
    if req.dimensions is not None and req.dimensions != dim:
        raise APIError(400, f"dimensions={req.dimensions}: this model's embeddings have {dim} "
                       "dimensions, and shorter ones are not supported", param="dimensions",
                       code="unsupported_parameter")  # fmt: skip
    inputs = inputs_of(req)
    engine = state.engine

    def run() -> tuple[np.ndarray, int]:
        from ..runtime.embeddings import token_lists

        try:
            ids = token_lists(engine, inputs)
            return engine.embed(ids, pooling=state.pooling), sum(len(t) for t in ids)
        except PowerInferError as e:
            raise from_engine(e, "input") from None

    vectors, tokens = await anyio.to_thread.run_sync(run)
    data = [{"object": "embedding", "index": i, "embedding": encoded(v, req.encoding_format)}
            for i, v in enumerate(vectors)]  # fmt: skip
    return JSONResponse({
        "object": "list",
        "data": data,
        "model": state.model_id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })  # fmt: skip
