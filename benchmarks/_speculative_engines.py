"""bench_speculative.py's engines: ours (plain, lookup or draft speculation, with a probe that
the API is there) and llama.cpp's plain and prompt-lookup decoding, each run returning a result
dict (tokens, decode seconds, the speculation counters)."""

from __future__ import annotations

import inspect
import time

from _bench_common import (
    require_powerinfer,
)

#: The speculation counters a run reports.
SPEC_KEYS = ("drafted", "accepted", "acceptance_rate", "verify_steps", "tokens_per_step")
MISSING_API = (
    "this powerinfer_rs has no speculative decoding yet (issue 61): {err}. "
    "Expected engine.generate(ids, ..., speculative='lookup'|'draft'|None, draft_max=K) and "
    "Engine.from_pretrained(path, draft=DRAFT_PATH). Run with --skip-spec to measure only "
    "the plain and llama.cpp modes."
)


class MissingApi(RuntimeError):
    pass


def open_ours(path, threads: int, n_ctx: int, draft=None):
    pi = require_powerinfer()
    kw = dict(threads=threads, n_ctx=n_ctx)
    if draft is None:
        return pi.Engine.from_pretrained(str(path), **kw)
    try:
        return pi.Engine.from_pretrained(str(path), draft=str(draft), **kw)
    except TypeError as e:
        raise MissingApi(MISSING_API.format(err=f"Engine.from_pretrained(draft=...): {e}")) from e


def check_draft_api() -> None:
    """Raise MissingApi when ``Engine.from_pretrained`` takes no ``draft=`` (before any run)."""
    params = inspect.signature(require_powerinfer().Engine.from_pretrained).parameters
    kinds = {p.kind for p in params.values()}
    if "draft" not in params and inspect.Parameter.VAR_KEYWORD not in kinds:
        raise MissingApi(MISSING_API.format(err="Engine.from_pretrained has no draft= argument"))


def ours_kwargs(n: int, spec: str | None, k: int) -> dict:
    # Plain is speculative="off" said explicitly: the engine's default ("auto") is lookup.
    kw = dict(max_new_tokens=n, temperature=0.0, seed=0, ignore_eos=True, speculative=spec)
    if spec != "off":
        kw["draft_max"] = k
    return kw


def ours_call_text(n: int, spec: str | None, k: int) -> str:
    args = ", ".join(f"{a}={v!r}" for a, v in ours_kwargs(n, spec, k).items())
    return f"engine.generate(ids, {args})"


def probe_spec(engine, ids: list[int], spec: str, k: int) -> None:
    """Raise MissingApi when ``engine.generate`` does not take ``speculative=spec``."""
    engine.reset()
    try:
        engine.generate(list(ids), **ours_kwargs(2, spec, k))
    except TypeError as e:
        raise MissingApi(MISSING_API.format(err=f"engine.generate(speculative=...): {e}")) from e


def run_ours(engine, ids: list[int], n: int, spec: str | None, k: int) -> dict:
    engine.reset()  # no prefix reuse between runs: every run prefills the prompt
    t0 = time.perf_counter()
    text = engine.generate(list(ids), **ours_kwargs(n, spec, k))
    wall = time.perf_counter() - t0
    st = engine.stats() if callable(getattr(engine, "stats", None)) else {}
    gen = int(st.get("completion_tokens", n))
    pre = float(st.get("prefill_seconds") or 0.0)
    if pre > 0:
        secs, how = wall - pre, "wall - prefill_seconds"
    else:
        secs, how = float(st.get("decode_seconds") or wall), "stats decode_seconds"
    out = {"text": text, "tokens": gen, "decode_s": secs, "timing": how, "wall_s": wall}
    out["stats_decode_tok_s"] = st.get("decode_tokens_per_second")
    # The engine's names of the speculation counters (tokens per step: per verification step).
    names = {
        "drafted": "drafted_tokens",
        "accepted": "accepted_tokens",
        "acceptance_rate": "acceptance_rate",
        "verify_steps": "verify_steps",
        "tokens_per_step": "tokens_per_verify_step",
    }
    for key in SPEC_KEYS:
        if st.get(names[key]) is not None:
            out[key] = st[names[key]]
    return out


def llama_lookup_class(llama_cpp):
    """LlamaPromptLookupDecoding that counts its calls (verify steps) and drafted tokens."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class Counting(LlamaPromptLookupDecoding):
        calls = 0
        drafted = 0

        def __call__(self, input_ids, /, **kwargs):
            out = super().__call__(input_ids, **kwargs)
            self.calls += 1
            self.drafted += len(out)
            return out

    return Counting


def run_llama(llm, ids: list[int], n: int, counter=None) -> dict:
    llm.reset()
    out = []
    t_first = None
    calls0 = drafted0 = 0
    gen = llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    try:
        for tok in gen:
            out.append(int(tok))
            if t_first is None:
                t_first = time.perf_counter()
                if counter is not None:
                    calls0, drafted0 = counter.calls, counter.drafted
            if len(out) >= n:
                break
        t_last = time.perf_counter()
    finally:
        gen.close()
    res = {"ids": out, "tokens": len(out), "decode_s": max(t_last - t_first, 1e-9)}
    if counter is not None:
        steps = counter.calls - calls0
        res["verify_steps"] = steps
        res["drafted"] = counter.drafted - drafted0
        res["tokens_per_step"] = (len(out) - 1) / steps if steps else None
    return res
