#!/usr/bin/env python3
"""Speculative decoding (issue 61): decode tokens/s of our prompt-lookup and draft-model
decoding against our plain decoding and llama.cpp's prompt-lookup decoding, in one process.

Tasks (``--tasks``, default all):

* ``rename`` (copies): a ~440-token Python file, "rename variable X to Y and output the whole
  file", through the model's chat template. Target: lookup >= 2x our plain decoding and >= 1.2x
  llama.cpp's prompt-lookup decoding.
* ``json`` (copies): a customer message, "answer with a JSON object that repeats its fields".
  Same targets.
* ``story`` (copies nothing): a story from a one-line prompt. Target: lookup >= 0.97x plain.
* ``draft`` (synthetic): a synthetic target/draft pair sharing one tokenizer (the same synthetic
  llama weights: target ``--target-dtype`` F16, draft ``--draft-dtype`` Q4_0, optionally with
  fewer layers) from pseudo-random prompt ids: ours plain on the target against ours with the
  draft model (``Engine.from_pretrained(target, draft=draft)``, ``speculative="draft"``);
  acceptance rate and speed-up, beside the "greedy agreement": the share of the target's
  greedy tokens that the draft's argmax predicts from the same prefix (``Engine.logits`` of
  both, untimed), which the acceptance rate should come near. Labelled synthetic.
  ``--draft-pair TARGET,DRAFT`` uses two real files instead.

Modes, alternated in one process (the order reversed every other repeat), ``--repeats`` each
after ``--warmup`` untimed runs; medians reported:

* ours plain:   ``engine.generate(ids, max_new_tokens=N, temperature=0, ignore_eos=True,
  speculative="off")`` (the engine's default, "auto", is lookup)
* ours lookup:  the same with ``speculative="lookup", draft_max=K``
* ours draft:   the same with ``speculative="draft", draft_max=K`` (draft task)
* llama plain:  ``Llama(model, n_threads=T).generate(ids, temp=0)`` (llama-cpp-python)
* llama lookup: ``Llama(model, n_threads=T, draft_model=LlamaPromptLookupDecoding(
  max_ngram_size=--llama-ngram, num_pred_tokens=K)).generate(ids, temp=0)``
  (``logits_all=True`` passed by hand: llama-cpp-python 0.3.36 forces it with a draft model but
  sizes its logits buffer by the argument and fails past n_batch positions). This is the peer
  as shipped: every verify step copies its K + 1 rows of logits into Python, and the draft is
  the continuation of the first (earliest) match of the last 1..max_ngram_size tokens.

Both engines get the same prompt token ids (ours: the chat template applied and tokenized by
our engine, exactly what ``engine.chat`` feeds; llama.cpp gets the ids, not the text), greedy,
and produce exactly N tokens (end-of-sequence ignored; llama's generator is stopped at N).

What is timed (prefill excluded on both sides, same formula): decode tokens/s = (N - 1) /
decode seconds, where the first generated token is the one the prompt's prefill yields and
decode seconds cover the other N - 1.
Ours: the wall time of the ``generate`` call minus its ``stats()["prefill_seconds"]`` (the
prompt's prefill; the rest is decode, Python sampling included; if the engine reports no
prefill seconds, ``stats()["decode_seconds"]`` is used and a note printed). The engine is reset
before each run (no prefix reuse). llama.cpp: the wall time from the first token its
``generate`` generator yields (prefill done) to the N-th; its state is reset before each run.
The ``stats()`` counters of speculation ("drafted_tokens", "accepted_tokens",
"acceptance_rate", "verify_steps", "tokens_per_verify_step") are shown as medians (ours
tok/step: tokens per verification step). For llama.cpp's lookup the script
counts the draft calls itself: verify steps = draft calls during decode, tokens/step = (N - 1) /
steps, drafted = the draft tokens proposed.

"copyable" (untimed, from one more greedy run of ours): the share of the greedy output tokens
that the most recent earlier match of the last 2 (else 1) tokens in prompt + output predicts; a
guide to what any prompt lookup can accept on this model and prompt.

Whether the texts agree is printed: our lookup against our plain (greedy speculation must not
change the text; batched verification rounds differently from one-token steps, so a late
divergence on a near-tie is possible, and is shown with its position), llama's lookup against
llama's plain, and ours against llama's (llama's ids decoded by our tokenizer).

Also printed: the exact command line, the host's read bandwidth (``powerinfer_rs._core.
measure_read_bandwidth``, as bench_decode.py) and the CPU use of each mode (process CPU s per
wall s; < 0.9 x threads means the machine was busy and the figures should be thrown away).

Examples::

    python benchmarks/bench_speculative.py                      # all tasks, 2 threads, 5 repeats
    python benchmarks/bench_speculative.py --tasks rename,json --repeats 7 --json out/spec.json
    python benchmarks/bench_speculative.py --quick              # smoke: few tokens, 1 repeat
    python benchmarks/bench_speculative.py --quick --skip-spec  # only the plain and llama modes
    python benchmarks/bench_speculative.py --tasks draft --draft-layers 4
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import (  # noqa: E402
    add_bandwidth_args,
    add_synthetic_args,
    bench_parser,
    default_model,
    import_llama,
    machine_info,
    measure_bandwidth,
    open_llama,
    write_json,
)
from _speculative_draft import run_draft_task  # noqa: E402
from _speculative_engines import (  # noqa: E402
    MissingApi,
    check_draft_api,
    llama_lookup_class,
    open_ours,
    ours_call_text,
    probe_spec,
)
from _speculative_race import run_chat_task  # noqa: E402
from _speculative_report import print_tables  # noqa: E402
from _speculative_tasks import TASKS  # noqa: E402

ALL_TASKS = [*TASKS, "draft"]


# ---------------------------------------------------------------------------------------------
# our engine


# ---------------------------------------------------------------------------------------------
# llama.cpp


# ---------------------------------------------------------------------------------------------
# one task


# ---------------------------------------------------------------------------------------------
# report


# ---------------------------------------------------------------------------------------------


def run(args) -> dict:
    tasks = args.tasks
    model = Path(args.model) if args.model else default_model()
    chat_tasks = [t for t in tasks if t != "draft"]
    mi = machine_info()
    print(f"command    : {shlex.join([sys.executable, *sys.argv])}")
    print(f"model      : {model}")
    print(f"tasks      : {', '.join(tasks)}; engines {', '.join(args.engines)}")
    print(
        f"runs       : {args.repeats} repeats (median) after {args.warmup} warm-up, "
        f"{args.threads} threads, draft_max {args.draft_max}"
    )
    print(f"machine    : {mi.get('cpu', '?')}, {mi['cpus']} cpus, load {mi.get('loadavg')}")
    bw, how = measure_bandwidth(args.threads, args.bw_bytes, args.bw_iters)
    print(f"mem BW     : {bw:.2f} GB/s ({how})", flush=True)
    rep = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "model": str(model),
        "threads": args.threads,
        "draft_max": args.draft_max,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "machine": mi,
        "bandwidth_gbs": bw,
        "bandwidth_method": how,
        "rows": [],
        "errors": [],
        "calls": [],
    }
    if "draft" in tasks and "ours" in args.engines and not args.skip_spec:
        check_draft_api()
    ctx = {}
    n_doc = args.tokens or "N"
    if chat_tasks:
        ctx["ours"] = open_ours(model, args.threads, args.n_ctx)
        rep["calls"].append(
            f"ours: Engine.from_pretrained({str(model)!r}, threads={args.threads}, "
            f"n_ctx={args.n_ctx}); ids = engine.tokenizer.encode(engine.format_chat(messages))"
        )
        rep["calls"].append(f"ours plain: {ours_call_text(n_doc, 'off', args.draft_max)}")
        if "ours" in args.engines and not args.skip_spec:
            probe_spec(ctx["ours"], [1, 2, 3, 4], "lookup", args.draft_max)
            rep["calls"].append(f"ours lookup: {ours_call_text(n_doc, 'lookup', args.draft_max)}")
        if "llama" in args.engines:
            llama_cpp, why = import_llama()
            if llama_cpp is None:
                rep["errors"].append(f"llama.cpp not run: {why}")
            else:
                kw = dict(n_batch=512, n_ubatch=512)
                counting = llama_lookup_class(llama_cpp)
                counter = counting(max_ngram_size=args.llama_ngram, num_pred_tokens=args.draft_max)
                ctx["llama_plain"] = open_llama(model, args.n_ctx, args.threads, **kw)
                # logits_all=True by hand: llama-cpp-python 0.3.36 turns it on with a draft
                # model but sizes its score buffer by the argument (n_batch rows), and the
                # first verify step past n_batch positions then fails to copy its logits.
                ctx["llama_lookup"] = open_llama(
                    model, args.n_ctx, args.threads, draft_model=counter, logits_all=True, **kw
                )
                ctx["counter"] = counter
                common = (
                    f"Llama({str(model)!r}, n_ctx={args.n_ctx}, n_threads={args.threads}, "
                    f"n_threads_batch={args.threads}, n_batch=512, n_ubatch=512"
                )
                gen = (
                    ".generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, "
                    f"repeat_penalty=1.0) stopped after {n_doc} tokens"
                )
                rep["calls"].append(f"llama plain: {common}){gen}")
                rep["calls"].append(
                    f"llama lookup: {common}, logits_all=True, "
                    "draft_model=LlamaPromptLookupDecoding("
                    f"max_ngram_size={args.llama_ngram}, num_pred_tokens={args.draft_max})){gen}"
                )
    for t in chat_tasks:
        rep["rows"].append(run_chat_task(t, args, ctx))
    for key in ("llama_plain", "llama_lookup"):
        if ctx.get(key) is not None:
            ctx[key].close()
    ctx.clear()
    if "draft" in tasks:
        if "ours" not in args.engines:
            rep["errors"].append("draft task: ours only (--engines has no 'ours')")
        else:
            row = run_draft_task(args)
            rep["rows"].append(row)
            spec = "draft" if not args.skip_spec else None
            draft_kw = f"draft={row['draft_model']!r}, " if spec else ""
            rep["calls"].append(
                f"ours {spec or 'plain'} (draft task): Engine.from_pretrained("
                f"{row['target_model']!r}, {draft_kw}threads={args.threads}, "
                f"n_ctx={args.n_ctx}); {ours_call_text(n_doc, spec, args.draft_max)}; ids: "
                f"{row['prompt_tokens']} pseudo-random ids (seed {args.seed}); draft for the "
                f"greedy agreement: {row['draft_model']!r}"
            )
    rep["loadavg_after"] = os.getloadavg()
    return rep


def parse_list(s: str, choices: list[str]) -> list[str]:
    out = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in out if x not in choices]
    if bad or not out:
        raise SystemExit(f"choose from {', '.join(choices)} (got {s!r})")
    return out


def main(argv=None) -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", help="GGUF file (default SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument(
        "--tasks", default=",".join(ALL_TASKS), help=f"comma-separated, of {', '.join(ALL_TASKS)}"
    )
    ap.add_argument("--engines", default="ours,llama", help="comma-separated: ours, llama")
    ap.add_argument("--threads", type=int, default=2, help="threads of both engines (default 2)")
    ap.add_argument(
        "--tokens",
        type=int,
        default=0,
        help="tokens generated per run (default per task: rename 256, json 128, story 256, "
        "draft 128; --quick 32)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per mode (default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per mode first")
    ap.add_argument(
        "--draft-max", type=int, default=10, help="draft tokens per step K, both engines (10)"
    )
    ap.add_argument(
        "--llama-ngram",
        type=int,
        default=2,
        help="LlamaPromptLookupDecoding's max_ngram_size (default 2, its own default)",
    )
    ap.add_argument(
        "--n-ctx",
        type=int,
        default=1024,
        help="context size of every engine (1024; llama's lookup keeps n_ctx x vocab logits)",
    )
    ap.add_argument(
        "--skip-spec",
        action="store_true",
        help="skip our speculative modes (smoke test of the rest on an engine without them)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 32 tokens, 1 repeat, small draft pair"
    )
    ap.add_argument(
        "--target-dtype", default="F16", help="draft task: synthetic target's dtype (F16)"
    )
    ap.add_argument("--draft-dtype", default="Q4_0", help="draft task: synthetic draft's dtype")
    ap.add_argument(
        "--draft-layers",
        type=int,
        default=0,
        help="draft task: layers of the synthetic draft (default: the target's)",
    )
    ap.add_argument(
        "--draft-prompt", type=int, default=64, help="draft task: prompt length (random ids)"
    )
    ap.add_argument("--draft-pair", metavar="TARGET,DRAFT", help="draft task: two real GGUFs")
    add_synthetic_args(ap)
    add_bandwidth_args(ap)
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    args.tasks = parse_list(args.tasks, ALL_TASKS)
    args.engines = parse_list(args.engines, ["ours", "llama"])
    if args.quick:
        args.tokens = args.tokens or 32
        args.repeats = 1
        args.bw_bytes = min(args.bw_bytes, 64 << 20)
        args.bw_iters = min(args.bw_iters, 2)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    try:
        rep = run(args)
    except MissingApi as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_tables(rep)
    write_json(args.json, rep)
    return 1 if rep["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
