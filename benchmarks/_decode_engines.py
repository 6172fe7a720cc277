"""Ours and llama.cpp (llama-cpp-python) as runners of the one race
(:class:`powerinfer_rs.benchmarking.Runner`: ``load``, ``run(workload)``, ``close``; the
workloads :class:`~powerinfer_rs.benchmarking.Decode` -> (tokens, seconds) and
:class:`~powerinfer_rs.benchmarking.Prefill` -> seconds), with ``decode``, ``prefill``,
``greedy_ids``, ``tokenize`` and ``bytes_per_token`` beside. bench_decode, bench_moe and
bench_hybrid race them."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from _bench_common import Decode, Prefill, import_llama, open_llama, require_powerinfer


class Workloads:
    """``load`` (engines load in ``__init__``) and ``run`` of the runner protocol, dispatching
    a workload to ``decode`` or ``prefill``."""

    def load(self) -> None:
        pass

    def run(self, workload):
        if isinstance(workload, Decode):
            return self.decode(list(workload.prompt_ids), workload.n)
        if isinstance(workload, Prefill):
            return self.prefill(list(workload.ids))
        raise TypeError(f"{type(self).__name__} runs Decode and Prefill, not {workload!r}")


class Ours(Workloads):
    name = "powerinfer-rs"

    def __init__(self, path: Path, threads: int, n_ctx: int):
        pi = require_powerinfer()
        kwargs = dict(threads=threads)
        try:
            self.eng = pi.Engine.from_pretrained(str(path), n_ctx=n_ctx, **kwargs)
        except TypeError:  # older signature without n_ctx
            self.eng = pi.Engine.from_pretrained(str(path), **kwargs)
        self.module = pi

    def bytes_per_token(self):
        try:
            return int(self.eng.bytes_per_token)
        except Exception:
            return None

    def tokenize(self, text: str) -> list[int]:
        return list(self.eng.tokenizer.encode(text))

    def _stats(self) -> dict | None:
        st = getattr(self.eng, "stats", None)
        if callable(st):
            try:
                d = st()
                if isinstance(d, dict) and "decode_seconds" in d:
                    return d
            except Exception:
                pass
        ls = getattr(self.eng, "last_stats", None)
        if ls is not None and hasattr(ls, "decode_seconds"):
            return {"decode_tokens": ls.decode_tokens, "decode_seconds": ls.decode_seconds}
        return None

    def _gen(self, prompt_ids, n_new):
        if hasattr(self.eng, "reset"):
            self.eng.reset()  # no prefix reuse between runs: every run prefills the prompt
        return self.eng.generate(
            list(prompt_ids), max_new_tokens=n_new, temperature=0.0, seed=0, ignore_eos=True
        )

    def decode(self, prompt_ids: list[int], n: int) -> tuple[int, float]:
        """Decode n tokens after the prompt; return (tokens decoded, seconds)."""
        self._gen(prompt_ids, n + 1)  # n+1 sampled tokens = n single-token forward steps
        st = self._stats()
        if st is not None:
            return int(st["decode_tokens"]), float(st["decode_seconds"])
        t0 = time.perf_counter()
        self._gen(prompt_ids, n + 1)
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._gen(prompt_ids, 1)
        t_one = time.perf_counter() - t0
        return n, max(t_full - t_one, 1e-9)

    def prefill(self, ids: list[int]) -> float:
        """Seconds of one batched forward pass over ``ids`` on an empty context."""
        self.eng.reset()
        t0 = time.perf_counter()
        self.eng.prefill(list(ids))
        return time.perf_counter() - t0

    def close(self):
        self.eng = None


class LlamaCpp(Workloads):
    name = "llama.cpp"

    def __init__(self, path: Path, threads: int, n_ctx: int, n_batch: int = 512):
        # One batch (and one micro-batch) holds a whole prefill of up to n_batch tokens.
        kw = dict(logits_all=False, n_batch=n_batch, n_ubatch=n_batch)
        self.llm = open_llama(path, n_ctx, threads, **kw)
        self.lib = import_llama()[0]
        self.n_vocab = self.llm.n_vocab()

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def _last_logits(self) -> np.ndarray:
        # llama-cpp-python >= 0.3 no longer copies logits into llm.scores unless
        # logits_all=True: read the last row straight from the context.
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def decode(self, prompt_ids: list[int], n: int) -> tuple[int, float]:
        llm = self.llm
        llm.reset()
        llm.eval(prompt_ids)
        tok = int(np.argmax(self._last_logits()))
        t0 = time.perf_counter()
        for _ in range(n):
            llm.eval([tok])
            tok = int(np.argmax(self._last_logits()))
        return n, time.perf_counter() - t0

    def prefill(self, ids: list[int]) -> float:
        """Seconds of one batched forward pass over ``ids`` on an empty context."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(list(ids))
        return time.perf_counter() - t0

    def greedy_ids(self, prompt_ids: list[int], n: int) -> list[int]:
        llm = self.llm
        llm.reset()
        llm.eval(prompt_ids)
        out = [int(np.argmax(self._last_logits()))]
        for _ in range(n - 1):
            llm.eval([out[-1]])
            out.append(int(np.argmax(self._last_logits())))
        return out

    def close(self):
        try:
            self.llm.close()
        except Exception:
            pass
        self.llm = None
