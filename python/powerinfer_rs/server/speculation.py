"""The speculative decoding options of a request (:mod:`..runtime.speculative`): its own
``speculative`` and ``draft_max`` fields (extensions of both APIs) over the server's defaults
(``serve --speculative``, ``--draft-max``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime.speculative import DEFAULT_DRAFT_MAX
from .errors import APIError


@dataclass(frozen=True)
class SpeculativeDefaults:
    """The server-wide defaults a request without the fields gets."""

    speculative: str = "auto"
    draft_max: int = DEFAULT_DRAFT_MAX


def speculative_kwargs(
    engine: Any, speculative: str | None, draft_max: int | None, defaults: SpeculativeDefaults
) -> dict[str, Any]:
    """``speculative`` and ``draft_max`` of :meth:`~powerinfer_rs.Engine.stream_tokens`; a
    request asking for the draft model of a server without one is a 400 naming the field."""
    mode = speculative if speculative is not None else defaults.speculative
    if mode == "draft" and getattr(engine, "draft", None) is None:
        raise APIError(
            400,
            "speculative 'draft' needs a draft model, and this server has none (serve "
            "--speculative PATH loads one); use 'lookup', 'auto' or 'off'",
            param="speculative",
        )
    return {
        "speculative": mode,
        "draft_max": draft_max if draft_max is not None else defaults.draft_max,
    }


#: The defaults of a server not told otherwise.
DEFAULTS = SpeculativeDefaults()
