"""The byte-level BPE vocabulary of the synthetic models (:mod:`.synth_model`): 3 special tokens
(``<|endoftext|>`` = BOS, ``<|im_start|>``, ``<|im_end|>`` = EOS), the 256 byte symbols, then
merges over common English letters until the vocabulary has the requested size."""

from __future__ import annotations

from ..errors import ShapeError

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 0, 2
_LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_level_vocab(vocab: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Tokens (in id order) and merges of a deterministic byte-level BPE of size ``vocab``.

    Ids 0..2 are the special tokens, 3..258 the byte symbols, the rest merges built
    breadth-first from ``Ġ`` (space) and letters by English frequency.
    """
    base = len(SPECIAL_TOKENS) + 256
    if vocab < base:
        raise ShapeError(f"a synthetic byte-level vocabulary needs at least {base} tokens")
    b2u = bytes_to_unicode()
    tokens = list(SPECIAL_TOKENS) + [b2u[b] for b in range(256)]
    merges: list[tuple[str, str]] = []
    have = set(tokens)
    space = b2u[ord(" ")]
    letters = list(_LETTERS)
    frontier = [space, *letters]
    while len(tokens) < vocab:
        nxt = []
        for left in frontier:
            for c in letters:
                tok = left + c
                if tok in have:
                    continue
                tokens.append(tok)
                merges.append((left, c))
                have.add(tok)
                nxt.append(tok)
                if len(tokens) == vocab:
                    return tokens, merges
        frontier = nxt
    return tokens, merges


def build_tokenizer(vocab: int):  # -> tokenizers.Tokenizer
    """The synthetic byte-level BPE as a ``tokenizers.Tokenizer`` (saved as tokenizer.json)."""
    import tokenizers
    from tokenizers import AddedToken, decoders, pre_tokenizers
    from tokenizers.models import BPE

    tokens, merges = byte_level_vocab(vocab)
    tok = tokenizers.Tokenizer(BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok
