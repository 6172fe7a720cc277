"""The byte-level BPE vocabulary of the synthetic models (:mod:`.synth_model`): 3 special tokens
(``<|endoftext|>`` = BOS, ``<|im_start|>``, ``<|im_end|>`` = EOS), the 256 byte symbols, then
merges over common English letters until the vocabulary has the requested size; and the chat
template each family's synthetic files store."""

from __future__ import annotations

from ..errors import ShapeError
from ..runtime.chat import CHATML_TEMPLATE

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


#: Chat templates in the style of each family's own (turn markers as the families write them;
#: ours, short), stored in the files the writer emits; ChatML for the rest.
FAMILY_TEMPLATES = {
    "gemma": (
        "{{ bos_token }}{% for m in messages %}<start_of_turn>"
        "{{ 'model' if m['role'] == 'assistant' else 'user' }}\n{{ m['content'] | trim }}"
        "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
        "{% endif %}"
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    ),
    # GLM-4.5's turn markers after its [gMASK]<sop> prefix; an assistant turn carries its
    # (empty unless given) <think></think> block; enable_thinking=false appends /nothink to the
    # user's turn and closes the generation prompt's thinking block.
    "glm4moe": (
        "[gMASK]<sop>{% set think = enable_thinking is not defined or enable_thinking %}"
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}<|assistant|>\n<think>"
        "{{ (m['reasoning_content'] or '') | trim }}</think>\n{{ m['content'] | trim }}"
        "{% else %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
        "{{ '/nothink' if m['role'] == 'user' and not think else '' }}{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>"
        "{{ '' if think else '\n<think></think>' }}{% endif %}"
    ),
}


def chat_template(arch: str) -> str:
    """The chat template the synthetic writer stores for family ``arch``."""
    return FAMILY_TEMPLATES.get("gemma" if arch.startswith("gemma") else arch, CHATML_TEMPLATE)
