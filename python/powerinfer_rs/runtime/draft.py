"""A draft model for speculative decoding (:mod:`.speculative`): a smaller model with the
target's tokenizer, run in a session of its own whose KV cache follows the target's context
(cut back to the accepted prefix after each verification, extended by the tokens it has not
seen in one batched pass)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from .. import _core
from ..errors import UnsupportedError
from .context import Context
from .prefix_cache import common_prefix
from .sampling import distribution, draw
from .speculative import Draft, SamplingState, merged_counts


class DraftMismatchError(UnsupportedError):
    """A draft model whose vocabulary differs from the target's (its size or its token
    strings): its token ids would mean other text."""


def check_same_vocab(target: Any, draft: Any) -> None:
    """Refuse (:class:`DraftMismatchError`) a draft model (a LoadedModel) whose vocabulary is
    not the target's: the same number of ids in the output head and in the tokenizer, and the
    same string for every id."""
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        raise DraftMismatchError(
            f"the draft model's vocabulary has {dv} tokens, the target's {tv}: a draft model "
            "needs the target's tokenizer"
        )
    ta, da = target.tokenizer, draft.tokenizer
    if ta.vocab_size != da.vocab_size:
        raise DraftMismatchError(
            f"the draft model's tokenizer has {da.vocab_size} tokens, the target's "
            f"{ta.vocab_size}: a draft model needs the target's tokenizer"
        )
    tmap = ta.inner.get_vocab(with_added_tokens=True)
    dmap = da.inner.get_vocab(with_added_tokens=True)
    if tmap != dmap:
        diff = sorted(set(tmap.items()) ^ set(dmap.items()), key=lambda kv: kv[1])[:1]
        where = f" (first difference: id {diff[0][1]})" if diff else ""
        raise DraftMismatchError(
            f"the draft model's token strings differ from the target's{where}: a draft model "
            "needs the target's tokenizer"
        )


class DraftModel:
    """A draft model's weights and session. :meth:`propose` brings its context to the given
    history (reusing the common prefix) and drafts k tokens: the argmax under greedy decoding,
    else a draw from the target's sampling rule applied to its own logits with the noise of
    the position it drafts for, the noise the target samples that position with (so the two
    agree where the distributions are close). No distribution goes with the draft:
    verification takes each position's own sample and never reads one."""

    def __init__(self, loaded: Any, model: Any, threads: int, n_ctx: int, kv_cache: str):
        self.loaded = loaded
        self._model = model
        #: The draft's context: its session and the tokens in its KV cache.
        self.ctx = Context(_core.Session(model, threads, min(n_ctx, loaded.config.max_context)))
        self.ctx.session.set_kv_cache(kv_cache)

    def fork(self) -> DraftModel:
        """A draft model over the same weights with a context of its own (a slot's,
        :mod:`.slots`: each generation running at once drafts in its own)."""
        s = self.ctx.session
        return DraftModel(self.loaded, self._model, s.threads, s.n_ctx, s.kv_cache)

    @property
    def n_ctx(self) -> int:
        return self.ctx.session.n_ctx

    @property
    def n_past(self) -> int:
        """Tokens in the draft's KV cache."""
        return self.ctx.session.n_past

    def _sync(self, history: Sequence[int]) -> np.ndarray:
        """Bring the cache to ``history``; the logits after its last token."""
        common = min(common_prefix(self.ctx.ids, history), len(history) - 1)
        self.ctx.cut_back(common)
        try:
            return self.ctx.feed(history[common:])
        except BaseException:
            self.ctx.resync()
            raise

    def propose(self, history: Sequence[int], k: int, state: SamplingState) -> Draft:
        k = min(k, self.n_ctx - len(history) + 1)  # d1..d(k-1) are fed after the history
        if k <= 0:
            return Draft([], [])
        logits = self._sync(history)
        tokens: list[int] = []
        for j in range(k):
            ids, p = distribution(
                logits, state.params, chain(state.seen, tokens), merged_counts(state.counts, tokens)
            )
            if state.params.temperature == 0.0:  # greedy: the argmax
                tokens.append(int(ids[0]))
            else:  # the noise the target samples that position with (the verification's)
                tokens.append(draw(ids, p, state.draws.at(state.position + j)))
            if j + 1 < k:
                logits = self.ctx.feed(tokens[-1:])
        return Draft(tokens, [None] * len(tokens))

    def rewind(self, n: int) -> None:
        """Keep only the first ``n`` tokens of the draft's context."""
        self.ctx.cut_back(n)
