"""Text <-> token ids, on top of the HF ``tokenizers`` library.

A :class:`Tokenizer` is built either from a ``tokenizer.json`` (HF model directories) or from
the vocabulary a GGUF file carries (``tokenizer.ggml.*``): GPT-2 style byte-level BPE
(``model = "gpt2"``, with the pre-tokenizer named by ``tokenizer.ggml.pre``) or SentencePiece
(``model = "llama"``, rebuilt as a byte-fallback BPE whose merge order follows the scores).
BOS is added by this class, never by a post-processor, so ``encode(add_bos=...)`` always means
what it says.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from ..errors import ModelFileError, TokenError, UnsupportedError

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    1,
    2,
    3,
    4,
    5,
    6,
)

#: The GPT-2 split pattern (what ``ByteLevel(use_regex=True)`` applies).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: The Llama-3 / cl100k split pattern.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def bpe_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for a GGUF ``tokenizer.ggml.pre`` name (byte-level BPE models).

    Known: ``gpt-2`` (llama.cpp's name), ``gpt2``, ``default`` (GPT-2 regex),
    ``smollm``/``starcoder``/``refact`` (every digit on its own, then the GPT-2 regex),
    ``llama3``/``llama-bpe`` (cl100k regex). Anything else falls back to the GPT-2 regex with
    a warning.
    """
    if pre in (None, "gpt-2", "gpt2", "default"):
        return _byte_level(True)
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), _byte_level(True)]
        )
    if pre in ("llama3", "llama-bpe", "llama-v3"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                _byte_level(False),
            ]
        )
    warnings.warn(
        f"unknown GGUF pre-tokenizer {pre!r}: using the GPT-2 split pattern", stacklevel=3
    )
    return _byte_level(True)


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Merges for a SentencePiece vocabulary: every split of a piece into two pieces, best
    scored merged piece first (how HF converts SentencePiece models to BPE)."""
    ids = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if types[i] not in (TOKEN_NORMAL, TOKEN_USER_DEFINED) or len(piece) < 2:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            li, ri = ids.get(left), ids.get(right)
            if li is not None and ri is not None:
                found.append((-scores[i], i, li, ri, left, right))
    found.sort()
    return [(m[4], m[5]) for m in found]


#: BPE pre-tokenizers after which llama.cpp adds BOS when the file does not say
#: (``tokenizer.ggml.add_bos_token`` absent; llama-vocab.cpp, the LLAMA3 pre type and tekken).
BPE_PRE_WITH_BOS = frozenset(
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")
    + ("jina-v5-nano", "tekken")
)


def unencodable(value: Any, where: str) -> str | None:
    """Why ``value`` cannot be handed to a tokenizer or grammar engine as text, or None.

    Python strings may hold lone surrogates (``"\\ud800"``: from ``surrogateescape`` decoding,
    a JSON ``"\\ud800"`` escape or a cut UTF-16 pair), which UTF-8, the HF tokenizers and
    llguidance cannot encode. ``value`` is a string or nested dicts and lists of them (keys
    included, walked without recursion); the answer names the first bad string by its path
    below ``where`` (``messages[0].content``) and the code point's index in it.
    """
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, str):
            if v.isascii():
                continue
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return (
                    f"{at} holds the lone surrogate U+{ord(v[e.start]):04X} at index {e.start}, "
                    "which is not text (UTF-8 cannot encode it)"
                )
        elif isinstance(v, Mapping):
            items = list(v.items())
            for k, x in reversed(items):
                stack.append((x, f"{at}.{k}" if isinstance(k, str) and k.isidentifier()
                              else f"{at}[{k!r}]"))  # fmt: skip
                if isinstance(k, str):
                    stack.append((k, f"{at} (a key)"))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{at}[{i}]") for i, x in reversed(list(enumerate(v))))
    return None


def check_text(name: str, text: str) -> str:
    """``text`` when a tokenizer can take it; else a :class:`TokenError` naming ``name`` (a
    lone surrogate: see :func:`unencodable`)."""
    problem = unencodable(text, name)
    if problem is not None:
        raise TokenError(problem)
    return text


class Tokenizer:
    """A tokenizer with the model's BOS/EOS conventions.

    ``encode(text)`` returns ids (BOS first when the model wants one), ``decode(ids)`` text.
    Special tokens such as ``<|im_start|>`` are one id each when ``special=True``.
    """

    def __init__(
        self,
        inner: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_ids: Iterable[int],
        add_bos: bool,
    ) -> None:
        self._inner = inner
        self._plain: tokenizers.Tokenizer | None = None  # twin that ignores special tokens
        self._n = inner.get_vocab_size(with_added_tokens=True)
        self.bos_id = bos_id
        self.eos_ids = [int(e) for e in dict.fromkeys(eos_ids)]
        self.add_bos = bool(add_bos)
        self._special = {
            int(i) for i, tok in inner.get_added_tokens_decoder().items() if tok.special
        }
        for t in [bos_id, *self.eos_ids]:
            if t is not None and not 0 <= t < self._n:
                raise ModelFileError(f"special token id {t} outside the vocabulary ({self._n})")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, source: Any) -> Tokenizer:
        """Build from GGUF metadata: a mapping key -> value, a parsed
        :class:`~powerinfer_rs.loading.gguf_file.GGUFFile` or a ``gguf.GGUFReader``."""
        if isinstance(source, Mapping):
            meta = source
        else:
            from ..loading.gguf_file import gguf_metadata

            meta = gguf_metadata(source)
        try:
            return cls._from_gguf_meta(meta)
        except (ModelFileError, UnsupportedError):
            raise
        except Exception as e:  # tokenizers raises plain Exception on bad vocabularies
            raise ModelFileError(f"GGUF tokenizer is malformed: {e}") from e

    @classmethod
    def _from_gguf_meta(cls, meta: Mapping[str, Any]) -> Tokenizer:
        model = meta.get("tokenizer.ggml.model")
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise ModelFileError("GGUF file has no tokenizer.ggml.tokens")
        n = len(tokens)
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * n
        if len(types) != n:
            raise ModelFileError("tokenizer.ggml.token_type length differs from the vocabulary")
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        if len(vocab) != n:
            raise ModelFileError("GGUF vocabulary has duplicate tokens")

        if model == "gpt2":
            merges_raw = meta.get("tokenizer.ggml.merges") or []
            merges = []
            for m in merges_raw:
                parts = m.split(" ", 1) if isinstance(m, str) else []
                if len(parts) != 2:
                    raise ModelFileError(f"malformed BPE merge {m!r}")
                merges.append((parts[0], parts[1]))
            inner = tokenizers.Tokenizer(BPE(vocab, merges, fuse_unk=False))
            inner.pre_tokenizer = bpe_pre_tokenizer(meta.get("tokenizer.ggml.pre"))
            inner.decoder = decoders.ByteLevel()
            default_add_bos = meta.get("tokenizer.ggml.pre") in BPE_PRE_WITH_BOS
            default_ids = (11, 11)
        elif model == "llama":
            scores = meta.get("tokenizer.ggml.scores") or [0.0] * n
            if len(scores) != n:
                raise ModelFileError("tokenizer.ggml.scores length differs from the vocabulary")
            unk_id = meta.get("tokenizer.ggml.unknown_token_id")
            unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < n else None
            merges = _spm_merges(tokens, [float(s) for s in scores], list(types))
            inner = tokenizers.Tokenizer(
                BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True)
            )
            norm: list[normalizers.Normalizer] = []
            if meta.get("tokenizer.ggml.add_space_prefix", True):
                norm.append(normalizers.Prepend("\u2581"))
            norm.append(normalizers.Replace(" ", "\u2581"))
            inner.normalizer = normalizers.Sequence(norm)
            dec: list[decoders.Decoder] = [
                decoders.Replace("\u2581", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
            ]
            if meta.get("tokenizer.ggml.add_space_prefix", True):
                dec.append(decoders.Strip(" ", 1, 0))
            inner.decoder = decoders.Sequence(dec)
            default_add_bos = True
            default_ids = (1, 2)
        else:
            raise UnsupportedError(
                f"GGUF tokenizer model {model!r} is not supported (supported: gpt2, llama)"
            )

        specials = [
            AddedToken(tokens[i], special=True, normalized=False)
            for i, ty in enumerate(types)
            if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        ]
        inner.add_special_tokens(specials)

        def _id(key: str, default: int | None = None) -> int | None:
            v = meta.get(key)
            if v is None and default is not None and default < n:
                return default
            return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

        # llama.cpp's ids when the file names none (llama-vocab.cpp: SPM 1 and 2, BPE 11 for
        # both; a default outside the vocabulary is dropped, a given id outside it refused).
        bos = _id("tokenizer.ggml.bos_token_id", default_ids[0])
        eos = _id("tokenizer.ggml.eos_token_id", default_ids[1])
        eos_ids = [
            e
            for e in (eos, _id("tokenizer.ggml.eot_token_id"), _id("tokenizer.ggml.eom_token_id"))
            if e is not None
        ]
        add_bos = meta.get("tokenizer.ggml.add_bos_token", default_add_bos)
        return cls(inner, bos_id=bos, eos_ids=eos_ids, add_bos=bool(add_bos) and bos is not None)

    @classmethod
    def from_hf_files(
        cls,
        tokenizer_json: str | os.PathLike[str],
        tokenizer_config: Mapping[str, Any] | None = None,
        extra_eos_ids: Iterable[int] = (),
        bos_id: int | None = None,
        default_ids: tuple[int | None, Iterable[int]] = (None, ()),
    ) -> Tokenizer:
        """Build from ``tokenizer.json`` plus the parsed ``tokenizer_config.json``.

        BOS/EOS come from ``tokenizer_config`` (``bos_token``/``eos_token``, strings or
        ``{"content": ...}``), falling back to ``bos_id``; ``extra_eos_ids`` (from
        ``generation_config.json`` / ``config.json``) are added to the stop ids. ``add_bos``
        follows ``add_bos_token`` when given, else whether the file's post-processor adds BOS.
        ``default_ids`` (BOS, EOS ids: the config class's defaults) apply where nothing above
        names one, when the vocabulary has them.
        """
        path = os.fspath(tokenizer_json)
        try:
            inner = tokenizers.Tokenizer.from_file(path)
        except Exception as e:
            raise ModelFileError(f"{path}: cannot read tokenizer: {e}") from e
        cfg = dict(tokenizer_config or {})

        def _tok_id(key: str) -> int | None:
            v = cfg.get(key)
            if isinstance(v, dict):
                v = v.get("content")
            return inner.token_to_id(v) if isinstance(v, str) else None

        n = inner.get_vocab_size(with_added_tokens=True)
        bos = _tok_id("bos_token")
        if bos is None:
            bos = bos_id
        if bos is None and default_ids[0] is not None and 0 <= default_ids[0] < n:
            bos = default_ids[0]
        eos_ids = [e for e in [_tok_id("eos_token"), *extra_eos_ids] if e is not None]
        eos_ids = eos_ids or [e for e in default_ids[1] if 0 <= e < n]
        if "add_bos_token" in cfg:
            add_bos = bool(cfg["add_bos_token"])
        else:
            try:
                with_sp = inner.encode("a", add_special_tokens=True).ids
                add_bos = bos is not None and bool(with_sp) and with_sp[0] == bos
            except Exception:
                add_bos = False
        inner.post_processor = None  # BOS is ours to add
        return cls(inner, bos_id=bos, eos_ids=eos_ids, add_bos=add_bos and bos is not None)

    # ------------------------------------------------------------------ queries
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._n

    @property
    def inner(self) -> tokenizers.Tokenizer:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._inner

    def _check(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int):
            try:
                i = int(i)  # numpy integers
            except (TypeError, ValueError):
                raise TokenError(f"token id must be an integer, got {i!r}") from None
        if not 0 <= i < self._n:
            raise TokenError(f"token id {i} outside the vocabulary (0..{self._n - 1})")
        return i

    def id_to_token(self, i: int) -> str:
        """The vocabulary string of id ``i`` (byte-level or ``▁`` form, not decoded text)."""
        tok = self._inner.id_to_token(self._check(i))
        if tok is None:
            raise TokenError(f"token id {i} has no string")
        return tok

    def token_to_id(self, s: str) -> int | None:
        """The id of vocabulary string ``s``, or ``None`` when it is not in the vocabulary (a
        string that is not text, holding a lone surrogate, never is)."""
        if isinstance(s, str) and unencodable(s, "s") is not None:
            return None
        return self._inner.token_to_id(s)

    def is_special(self, i: int) -> bool:
        """Whether id ``i`` is a control / special token."""
        return self._check(i) in self._special

    @property
    def special_ids(self) -> frozenset[int]:
        """All special token ids."""
        return frozenset(self._special)

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """Token ids of ``text``.

        ``add_bos=None`` follows the model's default. With ``special=False`` strings such as
        ``<|im_start|>`` are tokenized as plain text instead of becoming their special id.
        Text holding a lone surrogate (``"\\ud800"``) is a :class:`TokenError`.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        check_text("text", text)
        inner = self._inner
        if not special:
            if self._plain is None:
                plain = tokenizers.Tokenizer.from_str(self._inner.to_str())
                plain.encode_special_tokens = True
                self._plain = plain
            inner = self._plain
        ids = inner.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of ``ids``; raises :class:`TokenError` for an id outside the vocabulary."""
        checked = [self._check(i) for i in ids]
        return self._inner.decode(checked, skip_special_tokens=skip_special)

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self._n}, bos_id={self.bos_id}, eos_ids={self.eos_ids}, "
            f"add_bos={self.add_bos})"
        )
