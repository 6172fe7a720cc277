"""Which sparsity mode a call means, from the mode and the files given with it: the one rule the
Python API (``sparsity=``, ``thresholds=``, ``predictors=``) and the command line
(``--sparsity``, ``--thresholds``, ``--predictors``) share.

A file given without a mode selects the mode that uses it (said once); a file the chosen mode
would ignore, or both files without a mode, is refused with :class:`PlanError` rather than
silently dropped."""

from __future__ import annotations

import warnings
from typing import Callable

from ..errors import PlanError

#: The mode each file argument belongs to (thresholds: "threshold", or "input" for an input
#: threshold file).
FILE_MODES = ("threshold", "predictor")


def resolve_sparsity(
    sparsity: str | None,
    thresholds: object,
    predictors: object,
    *,
    default: str | None,
    spell: Callable[[str], str],
    say: Callable[[str], None],
) -> str | None:
    """The sparsity mode to run.

    ``spell(name)`` writes an argument as the caller's user knows it (``"thresholds="`` or
    ``"--thresholds"``); ``say`` tells the user once when a file selects the mode; ``default``
    is the mode when neither a mode nor a file is given."""
    from ..formats.input_thresholds import is_input_thresholds

    # Thresholds belong to threshold mode, or to the input mode (its own file or mapping, or
    # any thresholds when the input mode is asked for).
    t_mode = "threshold"
    if thresholds is not None and (sparsity == "input" or is_input_thresholds(thresholds)):
        t_mode = "input"
    given = [m for m, f in zip((t_mode, "predictor"), (thresholds, predictors)) if f is not None]
    arg = {t_mode: spell("thresholds"), "predictor": spell("predictors")}
    if sparsity is None:
        if len(given) > 1:
            raise PlanError(
                f"{arg[t_mode]} and {arg['predictor']} were both given: choose the mode "
                f"with {spell('sparsity')} {t_mode} or predictor"
            )
        if given:
            say(f"{arg[given[0]]} given: using {spell('sparsity')} {given[0]}")
            return given[0]
        return default
    for mode in given:
        if mode != sparsity:
            raise PlanError(
                f"{arg[mode]} is used only with {spell('sparsity')} {mode}, not with "
                f"{spell('sparsity')} {sparsity}; drop {arg[mode]} or pass "
                f"{spell('sparsity')} {mode}"
            )
    return sparsity


def api_sparsity(
    sparsity: str | None, thresholds: object, predictors: object, *, default: str | None
) -> str | None:
    """:func:`resolve_sparsity` for the Python API: arguments spelt ``thresholds=``, the mode a
    file selects said once with a ``UserWarning`` at the caller's line."""

    def say(message: str) -> None:
        warnings.warn(message, UserWarning, stacklevel=5)

    return resolve_sparsity(
        sparsity, thresholds, predictors, default=default, spell=lambda n: f"{n}=", say=say
    )
