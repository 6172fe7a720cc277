"""Errors in OpenAI's JSON shape, ``{"error": {"message", "type", "param", "code"}}``, and the
mapping from the engine's exceptions and from request validation to them."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ..errors import ContextOverflowError, PowerInferError


class APIError(Exception):
    """An error answered to the client with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _loc(loc: tuple) -> str:
    """A pydantic error location as OpenAI names parameters: ``messages[0].role``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "list[int]", "list[str]", "list[TextPart]", "none", "float", "int"):
            continue  # the branch of a union pydantic tried, not a field
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation(e: ValidationError) -> APIError:
    """A 400 naming the first field at fault (and how many more there are)."""
    errors = e.errors(include_url=False)
    first = errors[0]
    param = _loc(first["loc"])
    value = first.get("input")
    shown = "" if isinstance(value, (dict, list)) else f" (got {value!r})"
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    if first["type"] == "missing":
        msg = f"'{param}' is required"
    else:
        msg = f"'{param}': {first['msg']}{shown}"
    return APIError(400, msg + more, param=param or None, code="invalid_value")


def from_engine(e: PowerInferError, param: str) -> APIError:
    """A 400 for a request the engine refused (``param``: the field that carried the input)."""
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), param=param, code="context_length_exceeded")
    return APIError(400, f"{type(e).__name__}: {e}", param=param, code="invalid_value")


def parse_body(body: bytes, kind: type) -> Any:
    """A request body validated strictly as the pydantic model ``kind``: invalid JSON and the
    first field at fault are 400s (:func:`from_validation`)."""
    try:
        return kind.model_validate_json(body, strict=True)
    except ValidationError as e:
        if e.errors()[0]["type"] == "json_invalid":
            raise APIError(400, f"the body is not valid JSON: {e.errors()[0]['msg']}") from None
        raise from_validation(e) from None
