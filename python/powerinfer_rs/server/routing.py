"""What every OpenAI route shares: the wrapper answering failures in OpenAI's error shape, the
API-key check and the unknown-model error."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .auth import bearer_key, key_matches
from .errors import APIError

if TYPE_CHECKING:
    from .app import ServerState

log = logging.getLogger("powerinfer_rs.server")


def api_route(
    fn: Callable[[Request, Any], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route answering every failure in OpenAI's error shape, never with a traceback."""

    @functools.wraps(fn)
    async def route(request: Request) -> Response:
        state = request.app.state.server
        try:
            return await fn(request, state)
        except APIError as e:
            log.info("%s %s -> %d %s", request.method, request.url.path, e.status, e.message)
            return error_response(e)
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(APIError(500, "internal server error", type="server_error"))

    return route


def error_response(e: APIError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def check_key(request: Request, state: ServerState) -> None:
    if not state.api_keys:
        return
    given = request.headers.get("authorization", "")
    if not key_matches(bearer_key(given), state.api_keys):
        what = "no API key given" if not given else "incorrect API key"
        raise APIError(401, f"{what} (send 'Authorization: Bearer KEY')", code="invalid_api_key")


def unknown_model(name: str, state: ServerState) -> APIError:
    return APIError(
        404,
        f"the model '{name}' does not exist; this server serves '{state.model_id}'",
        param="model",
        code="model_not_found",
    )
