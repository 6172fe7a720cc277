"""Auto-fit: from a model file to its hybrid run in one step.

:func:`prepare` runs the sparsity pipeline's stages for a model and a VRAM budget, exactly as
they run by hand (each stage's function, the one its command calls, with the same arguments),
on the calibration text shipped with the package (``data/calibration.txt``: prose of the
Python 3.11 documentation, PSF License, see ``data/CALIBRATION-LICENSE.txt``):

1. ``calibrate``: per-layer thresholds (SiLU/GELU models; ReLU neurons are exactly 0 or not);
2. ``profile``: how often each FFN neuron fires (with samples for the predictors of a ReLU
   model);
3. ``train-predictors``: ReLU models without predictors of their own (a mixture of experts:
   per expert, on the CPU only; with a plan its ReLU experts run exact-relu, as the GPU side
   has no predictors inside experts);
4. ``plan``: the placement under the budget.

The results go into a directory of their own under the cache (``$POWERINFER_RS_CACHE/prepared``),
named after a key of the model's fingerprint, the budget, the hardware profile, the context, the
KV-cache precision and the package version, with ``prepared.json`` written last: a directory with
it is complete and is reused at once (``refresh`` rebuilds it). ``--model DIR`` and ``--plan
DIR`` accept such a directory (:func:`read_prepared`).

The stages run in a working directory beside the target (``.NAME.part-PID-N``), which replaces
the target only once whole, under a lock per target (``<cache>/prepare-locks``, ``flock``): a
second preparation of the same model and budget started meanwhile (a second server, a second
command) waits for the first and reuses its result, and a preparation that dies (killed, out of
disk) leaves only its working directory, which the next one removes before it prepares again.

The profiled tokens shrink with the model's size (:func:`stage_tokens`), so that a 7B model is
ready in minutes: the stages read every weight once per token window, and what is learnt from
the first thousand tokens changes little after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import PlanError, PowerInferError
from ..planning.sizes import MAX_BUDGET
from .prepared import (
    MANIFEST,
    MANIFEST_FORMAT,
    Prepared,
    checked,
    content_digest,
    file_digests,
    load_manifest,
    model_problem,
    model_record,
    read_prepared,
    write_manifest,
)

__all__ = [
    "MANIFEST",
    "Prepared",
    "prepare",
    "read_prepared",
    "reusable",
    "check_budget",
    "stage_tokens",
]

#: The calibration and profiling text shipped with the package.
CORPUS = Path(__file__).resolve().parent.parent / "data" / "calibration.txt"
#: Model bytes up to which the stages take their full token counts; above, fewer (inversely).
FULL_TOKENS_BYTES = 512 * 2**20
#: Tokens of (calibration, profile) for a small model, and the least a large one gets.
FULL_TOKENS = (4096, 8192)
MIN_TOKENS = (512, 1024)


def stage_tokens(model_bytes: int) -> tuple[int, int]:
    """``(calibration tokens, profile tokens)`` for a model of ``model_bytes``: the stages'
    defaults up to :data:`FULL_TOKENS_BYTES`, then fewer in proportion, down to
    :data:`MIN_TOKENS`."""
    scale = min(1.0, FULL_TOKENS_BYTES / max(1, model_bytes))
    return tuple(max(lo, int(full * scale)) for full, lo in zip(FULL_TOKENS, MIN_TOKENS))  # type: ignore[return-value]


def token_bytes(loaded: Any) -> int:
    """The weight bytes a profiled token costs, which sets the stages' token counts: the whole
    model, or for a mixture of experts its routed share of the experts (``n_expert_used`` of
    ``n_expert``) and everything else, so that each expert still sees enough tokens for its
    predictor."""
    c = loaded.config
    total = sum(t.nbytes for t in loaded.tensors.values())
    if not c.n_expert:
        return total
    experts = sum(t.nbytes for name, t in loaded.tensors.items() if name.endswith("_exps"))
    return int(total - experts * (1.0 - c.n_expert_used / c.n_expert))


def prepared_root() -> Path:
    """Where prepared directories live: ``<cache>/prepared``."""
    from .default_model import cache_dir

    return cache_dir() / "prepared"


def _version() -> str:
    from .._version import __version__

    return __version__


def resolve_hardware(name: str | None) -> tuple[str, str | None]:
    """The hardware profile's name (or file) the plan stage will use for ``name``, and the
    detected GPU's name (None without one)."""
    from ..planning.gpu_probe import detect_gpu
    from ..planning.hardware_profile import FALLBACK_PROFILE, profile_for_gpu_name

    gpu = detect_gpu()
    if name is not None:
        return name, gpu.name if gpu else None
    if gpu is not None:
        return profile_for_gpu_name(gpu.name) or FALLBACK_PROFILE, gpu.name
    return FALLBACK_PROFILE, None


def _key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class _Stages:
    """Runs the stages of one preparation as functions, timing each: a stage's report lines
    go to stderr, or with ``quiet`` are held and shown only when the stage fails; a failing
    stage is a :class:`PlanError` naming it."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        #: Whether the stages draw their progress bars.
        self.progress = not quiet
        self.seconds: dict[str, float] = {}
        self._held: list[str] = []

    def report(self, text: str) -> None:
        """A stage's report line (what its command prints)."""
        if self.quiet:
            self._held.append(text)
        else:
            print(text, file=sys.stderr)

    def run(self, name: str, fn: Callable[..., Path], *args: Any, **kwargs: Any) -> Path:
        """``fn(*args, **kwargs, report=...)``, timed as stage ``name``."""
        self._held = []
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs, report=self.report)
        except (PowerInferError, OSError) as e:
            for line in self._held:
                print(line, file=sys.stderr)
            raise PlanError(f"auto-fit: the {name} stage failed: {_why(e)}") from e
        self.seconds[name] = time.perf_counter() - t0
        return result


def _why(e: BaseException) -> str:
    """An error in the words the stage commands print it in."""
    if isinstance(e, OSError):
        name = f"{e.filename}: " if getattr(e, "filename", None) else ""
        return f"{name}{e.strerror or e}"
    return str(e)


def check_budget(vram_budget: str | int) -> int | None:
    """The bytes of an auto-fit's ``vram_budget`` (None for "auto"), checked before any work:
    a :class:`PlanError` for anything that is not a size (a unit it does not know, a negative
    or non-finite number), for 0 (a plan that places nothing on the GPU: run without a budget)
    and for more than :data:`MAX_BUDGET`."""
    from ..planning.sizes import format_bytes, parse_bytes

    if isinstance(vram_budget, str) and vram_budget.strip().lower() == "auto":
        return None
    if isinstance(vram_budget, float):  # parse_bytes reads it from its text
        vram_budget = repr(vram_budget)
    if not isinstance(vram_budget, (str, int)):
        raise PlanError(f"vram budget: not a size: {vram_budget!r}; write e.g. 8GiB or auto")
    try:
        n = parse_bytes(vram_budget)
    except OverflowError:  # int(float) of a huge text
        n = MAX_BUDGET + 1
    except PlanError as e:
        raise PlanError(f"vram budget: {e}") from None
    if n <= 0:
        raise PlanError(
            f"vram budget {vram_budget!r} places nothing on the GPU: give a size, or auto, or run "
            "without --vram-budget on the CPU"
        )
    if n > MAX_BUDGET:
        raise PlanError(
            f"vram budget {vram_budget!r} is more than {format_bytes(MAX_BUDGET)}, more than any "
            "GPU holds: give the GPU's memory or less, or auto"
        )
    return n


def _key_difference(old: dict, new: dict) -> str:
    """What an existing directory was prepared for that differs from ``new``'s key, in words."""
    if any(old.get(k) != new[k] for k in ("fingerprint", "content")):
        return "it was prepared for another model, or an older version of this one"
    diff = [k for k in sorted(new) if old.get(k) != new[k]]
    return "it was prepared for another " + ", ".join(
        f"{k} ({old.get(k)!r}, now {new[k]!r})" for k in diff
    )


def reusable(d: Path, parts: dict, model: str) -> tuple[Prepared | None, str | None]:
    """The prepared directory ``d`` when it was prepared for ``parts`` from ``model``'s bytes
    and every file matches its digest (its ``model`` is then ``model``); else None and why
    (None too when ``d`` holds no manifest: nothing was prepared there)."""
    try:
        if not (d / MANIFEST).is_file():
            return None, None
        man = load_manifest(d)
        if man["key"] != parts:
            return None, _key_difference(man["key"], parts)
        why = model_problem(model, man["model_files"])
        if why is not None:
            return None, f"the model is not the one it was prepared from ({why})"
        done = checked(d)
    except PlanError as e:
        return None, str(e)
    except OSError as e:
        return None, f"cannot read it ({e})"
    if done.manifest["model_files"] != man["model_files"]:  # a copy recognised by its bytes
        done.manifest["model_files"] = man["model_files"]
        with contextlib.suppress(OSError):
            write_manifest(d, done.manifest)
    done.model = model
    return done, None


def prepare(
    model: str | os.PathLike[str] | None,
    vram_budget: str | int,
    *,
    device: str = "cuda",
    hardware: str | None = None,
    context: int | None = None,
    kv_cache: str = "f16",
    threads: int = 0,
    out: str | os.PathLike[str] | None = None,
    refresh: bool = False,
    quiet: bool = False,
) -> Prepared:
    """Prepare ``model`` (a path; None: the default model) to run on ``device`` within
    ``vram_budget`` ("auto": the free memory of GPU 0; or a size, checked first by
    :func:`check_budget`): the stages of the module doc, into ``out`` or the cache. Each stage
    prints a one-line summary on stderr (and its progress bar unless ``quiet``).

    A directory already prepared there is reused at once, unless ``refresh``, when it was
    prepared for the same key from the same model bytes and its files match their digests;
    otherwise it is prepared again, with a line on stderr saying why. That holds for ``out``
    too: ``prepare --out DIR`` asks for DIR to hold this model at this budget, so a DIR made for
    another budget or model is remade, as ``make`` remakes an out-of-date target (refusing would
    only make the user type ``--refresh``; reusing it runs the wrong plan). The returned
    :class:`Prepared` runs ``model``, wherever the directory was prepared from.

    With "auto" and no GPU (or a CPU ``device``) nothing is planned: it says so and prepares
    the CPU's sparse mode (thresholds or predictors) only."""
    from ..loading import load_model, resolve_model
    from ..planning.sizes import format_bytes
    from .default_model import default_model_path

    budget = check_budget(vram_budget)
    path = os.path.abspath(default_model_path() if model is None else resolve_model(model))
    own = _own_predictors(path)
    if own:
        from ..loading.powerinfer_gguf import load_powerinfer_gguf

        loaded = load_powerinfer_gguf(path).model
    else:
        loaded = load_model(path)
    cfg = loaded.config
    hw_name, gpu = resolve_hardware(hardware)
    auto = budget is None
    if auto and (gpu is None or device == "cpu"):
        why = "no GPU was found" if gpu is None else "the device is the CPU"
        print(f"auto-fit: {why}: running on the CPU, nothing planned", file=sys.stderr)
        budget_text = None
    else:
        budget_text = "auto" if auto else str(budget)
    ctx = min(context or 4096, cfg.max_context)
    cal_tokens, prof_tokens = stage_tokens(token_bytes(loaded))
    relu = cfg.activation == "relu"
    parts = {
        "fingerprint": loaded.fingerprint,
        "content": content_digest(loaded.tensors),
        "budget": budget_text,
        "free_at_prepare": _free_bytes() if auto and budget_text else None,
        "hardware": hw_name,
        "context": ctx,
        "kv_cache": kv_cache,
        "version": _version(),
        "pipeline": PIPELINE_REVISION,
        "tokens": [cal_tokens, prof_tokens],
    }
    final = Path(out) if out is not None else prepared_root() / _key(parts)
    if not refresh:
        done, why = reusable(final, parts, path)
        if done is not None:
            return done
    with _preparing(final) as d:
        # Another preparation of this directory may have finished while this one waited.
        done, why = reusable(final, parts, path)
        if done is not None and not refresh:
            return done
        if why is not None:
            print(f"auto-fit: {final}: {why}; preparing it again", file=sys.stderr)
        _run_stages(d, path, loaded, own, relu, budget_text, hardware, hw_name, ctx,
                    kv_cache, parts, threads, quiet)  # fmt: skip
        _put_in_place(d, final, own_dir=out is None)
    total = sum(load_manifest(final)["seconds"].values())
    budget_note = "" if budget_text is None else f", budget {format_bytes(_budget_of(final))}"
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in load_manifest(final)["seconds"].items())
    print(
        f"auto-fit: prepared in {total:.1f} s ({steps}){budget_note}; cached in {final}",
        file=sys.stderr,
    )
    result = read_prepared(final)
    assert result is not None
    result.model = path
    return result


def _run_stages(
    d: Path,
    path: str,
    loaded: Any,
    own: bool,
    relu: bool,
    budget_text: str | None,
    hardware: str | None,
    hw_name: str,
    ctx: int,
    kv_cache: str,
    parts: dict[str, Any],
    threads: int,
    quiet: bool,
) -> None:
    """Run the stages of the module doc into the empty directory ``d``, its manifest last."""
    from ..stages.calibrate import calibrate
    from ..stages.plan import plan
    from ..stages.profile import profile
    from ..stages.train_predictors import train

    cfg = loaded.config
    cal_tokens, prof_tokens = parts["tokens"]
    stages = _Stages(quiet)
    files: dict[str, str | None] = {"plan": None, "thresholds": None, "predictors": None}
    if not relu:
        files["thresholds"] = "thresholds.json"
        stages.run("calibrate", calibrate, path, [str(CORPUS)], d / "thresholds.json",
                   tokens=cal_tokens, threads=threads, progress=stages.progress)  # fmt: skip
    # A mixture of experts on the GPU side runs its ReLU experts exact-relu where the hybrid
    # runs no predictors inside experts (the engine's mode table); on the CPU alone,
    # predictors per expert where they pay.
    moe_gpu = bool(cfg.n_expert) and budget_text is not None
    sparsity = "threshold" if not relu else _relu_mode(moe_gpu)
    need_predictors = relu and not own and sparsity == "predictor"
    if budget_text is not None or need_predictors:
        stages.run(
            "profile", profile, path, [str(CORPUS)], d / "profile", tokens=prof_tokens,
            thresholds=d / "thresholds.json" if files["thresholds"] else None,
            samples=need_predictors, plot=False, threads=threads, progress=stages.progress,
        )  # fmt: skip
    if need_predictors:
        files["predictors"] = "predictors.safetensors"
        stages.run("train-predictors", train, path, d / "profile", d / files["predictors"],
                   progress=stages.progress)  # fmt: skip
    if budget_text is not None:
        files["plan"] = "plan.safetensors"
        predictors = d / files["predictors"] if files["predictors"] else None
        stages.run(
            "plan", plan, path, d / "profile", budget_text, out=d / "plan.safetensors",
            context=ctx, kv_cache=kv_cache,
            # else the stage detects the GPU and measures this CPU
            hardware=hw_name if hardware is not None else None,
            predictors=predictors,
            # what a neuron costs: thresholds (SiLU/GELU) or a PowerInfer file's predictors
            sparsity=None if predictors is not None else sparsity, summary_only=quiet,
        )  # fmt: skip
    write_manifest(d, _manifest(d, path, parts, files, sparsity, stages.seconds))


def _manifest(
    d: Path,
    path: str,
    parts: dict[str, Any],
    files: dict[str, str | None],
    sparsity: str,
    seconds: dict[str, float],
) -> dict[str, Any]:
    """The manifest of the preparation in ``d``: its key, files and their digests, the
    sparsity it runs in and the stages' seconds."""
    ours = {v for v in files.values() if v is not None}
    profiled = "profile" in seconds
    digests = {
        k: v
        for k, v in file_digests(d).items()
        if k in ours or (profiled and k.startswith("profile/"))
    }
    return {
        "format": MANIFEST_FORMAT,
        "model": path,
        "model_files": model_record(path),
        "key": parts,
        "files": files,
        "digests": digests,
        "sparsity": sparsity,
        "seconds": seconds,
        "corpus": "data/calibration.txt (Python 3.11 documentation, PSF License)",
    }


#: Prefix of a preparation's working directory beside its target (``.NAME.part-PID-N``).
PART = ".part-"


@contextlib.contextmanager
def _preparing(final: Path):
    """Hold the lock of ``final`` (a file under the cache's ``prepare-locks`` named after
    ``final``'s absolute path, ``fcntl.flock``: a second preparation waits, saying so, and then
    finds the first one's result) and yield an empty
    working directory beside it, removed afterwards whatever happens. Working directories left
    by a preparation that died (killed mid-way) are removed first: none is ever taken for
    ``final``, which only a whole preparation replaces."""
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists() and not final.is_dir():
            raise NotADirectoryError(f"{final} is not a directory")
        locks = prepared_root().parent / "prepare-locks"
        locks.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:24]
        lock = open(locks / f"{name}.lock", "a+b")  # noqa: SIM115 (held below)
    except OSError as e:
        raise PlanError(f"auto-fit: cannot prepare into {final}: {e}") from None
    with lock:
        try:
            import fcntl
        except ImportError:  # no POSIX locks (Windows): one preparation at a time is the user's
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"auto-fit: {final} is being prepared by another process; waiting for it",
                      file=sys.stderr, flush=True)  # fmt: skip
                fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in final.parent.glob(f".{final.name}{PART}*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = final.parent / f".{final.name}{PART}{os.getpid()}-{time.monotonic_ns()}"
        try:
            work.mkdir()
        except OSError as e:
            raise PlanError(f"auto-fit: cannot prepare into {final}: {e}") from None
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _put_in_place(work: Path, final: Path, *, own_dir: bool) -> None:
    """Move the whole preparation in ``work`` to ``final``. The cache's own directory is
    replaced by a rename (nothing of the old one is kept); a user's ``--out DIR`` keeps its
    other files, the prepared ones moved in over theirs and the manifest last, so DIR is
    complete exactly when it has one."""
    try:
        if own_dir:
            if final.is_dir():
                shutil.rmtree(final)
            os.replace(work, final)
            return
        final.mkdir(parents=True, exist_ok=True)
        (final / MANIFEST).unlink(missing_ok=True)
        for src in sorted(work.rglob("*"), key=lambda p: p.name == MANIFEST):
            dst = final / src.relative_to(work)
            if src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            elif src.name != MANIFEST or src.parent != work:
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
        os.replace(work / MANIFEST, final / MANIFEST)
    except OSError as e:
        raise PlanError(f"auto-fit: cannot prepare into {final}: {e}") from None


#: Bumped when what the stages prepare changes for the same inputs (2: mixtures of experts get
#: predictors per expert on the CPU, exact-relu with a plan; 3: the key holds the weights'
#: content digest, the manifest every file's digest), so older prepared directories are not
#: reused.
PIPELINE_REVISION = 3


def _relu_mode(moe_gpu: bool) -> str:
    """The mode a ReLU model runs in: predictor, or exact-relu for a mixture of experts with a
    GPU plan where the GPU side runs no predictors inside experts (the engine's mode table)."""
    from ..facts import mode_row

    return "exact-relu" if moe_gpu and not mode_row("predictor")["moe_gpu"] else "predictor"


def _budget_of(d: Path) -> int:
    """The budget the plan in ``d`` was made for."""
    from ..formats.plan import load_plan

    return load_plan(d / "plan.safetensors").budget_bytes


def _free_bytes() -> int | None:
    """GPU 0's free memory (part of the key of an "auto" budget), or None."""
    from ..planning.gpu_probe import detect_gpu

    gpu = detect_gpu()
    return None if gpu is None else gpu.free_bytes


def _own_predictors(path: str) -> bool:
    """Whether the file carries its own predictors (a PowerInfer GGUF)."""
    from ..loading.powerinfer_gguf import is_powerinfer_gguf

    return is_powerinfer_gguf(path)
