"""What the OpenAI endpoints do with top-level body fields their request models do not declare
(:mod:`.schemas`): nothing is dropped in silence. A field is either a documented no-op
(:data:`NO_OPS`, each with why ignoring it changes nothing the client gets), a feature at its
"off" value (:data:`OFF_VALUES`: DRY and XTC, which the engine does not implement, are accepted
only when they ask for nothing), or a 400 naming it (:func:`unknown_field_error`)."""

from __future__ import annotations

from typing import Any

from .errors import APIError

#: Fields accepted and ignored, and why that is right: what the openai client, Open WebUI and
#: llama.cpp's web UI send that asks this server for nothing it could do differently.
NO_OPS: dict[str, str] = {
    "user": "an end-user id for OpenAI's abuse monitoring; nothing is monitored or logged by user",
    "safety_identifier": "user's successor in OpenAI's API (abuse monitoring); as user",
    "metadata": "tags for OpenAI's stored-completions dashboard; nothing is stored",
    "store": "asks OpenAI to store the completion for evals or distillation; nothing is stored",
    "service_tier": "OpenAI's processing tier (latency/price class); this server has one",
    "prompt_cache_key": "OpenAI's cache-routing hint; the prefix cache (serve --cache-ram) "
    "matches prompts by their tokens, whatever the key",
    "cache_prompt": "llama.cpp's switch for reusing a cached prefix; reuse here is always on "
    "(the engine's context keeps its common prefix, and the slots' prefix cache when set), "
    "and the output is the same either way",
    "id_slot": "llama.cpp's choice of slot; the slot pool assigns slots (any slot gives the "
    "same output)",
    "timings_per_token": "llama.cpp's per-chunk timings; the chunks are the same without them",
}

#: Features the engine does not implement, accepted at the value that turns them off, and the
#: value of a "switch" field that makes its companions inert: DRY (llama.cpp's "don't repeat
#: yourself" penalty: off at dry_multiplier 0, its other fields then unused) and XTC (exclude
#: top choices: off at xtc_probability 0).
OFF_VALUES: dict[str, float] = {"dry_multiplier": 0.0, "xtc_probability": 0.0}
COMPANIONS: dict[str, str] = {
    "dry_base": "dry_multiplier",
    "dry_allowed_length": "dry_multiplier",
    "dry_penalty_last_n": "dry_multiplier",
    "dry_sequence_breakers": "dry_multiplier",
    "xtc_threshold": "xtc_probability",
}
NOT_IMPLEMENTED = {"dry_multiplier": "DRY sampling", "xtc_probability": "XTC sampling"}


def _off(value: Any, off: float) -> bool:
    return value is None or (not isinstance(value, bool) and value == off)


def unknown_field_error(extra: dict[str, Any]) -> APIError | None:
    """The 400 for the first undeclared field of a body (``extra``: name -> value) that is
    neither a no-op nor a feature left off, naming it in ``param``; None when there is none."""
    for name in extra:
        if name in NO_OPS:
            continue
        switch = COMPANIONS.get(name, name)
        if switch in OFF_VALUES:
            if _off(extra.get(switch), OFF_VALUES[switch]):
                continue  # the feature is off: asking nothing
            what = NOT_IMPLEMENTED[switch]
            return APIError(
                400,
                f"'{switch}'={extra.get(switch)!r}: {what} is not implemented by this server "
                f"(give {switch}=0 or leave it out)",
                param=switch,
                code="unsupported_parameter",
            )
        return APIError(
            400,
            f"'{name}' is not a parameter this server knows (it is refused rather than "
            f"ignored; accepted no-ops: {', '.join(sorted(NO_OPS))})",
            param=name,
            code="unknown_parameter",
        )
    return None
