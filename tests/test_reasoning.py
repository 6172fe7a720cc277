"""The ``<think>`` reasoning splitter on transcripts as thinking models write them: a closed
block, a forced-open one (the prompt ends with ``<think>\\n``), none; streamed at every chunk
boundary, which must give the non-streamed split and never show part of a tag."""

from __future__ import annotations

import pytest

from powerinfer_rs.runtime.reasoning import (
    ReasoningSplitter,
    forced_open,
    split_reasoning,
    template_thinks,
)

CASES = [
    ("<think>\nThe user greets me.\n</think>\n\nHello!", False, "The user greets me.", "Hello!"),
    ("The user greets me.\n</think>\n\nHello!", True, "The user greets me.", "Hello!"),
    ("<think>\n\n</think>\n\nHello!", False, "", "Hello!"),  # Qwen3 without thinking
    ("Hello! a < b </thin", False, "", "Hello! a < b </thin"),
    ("Hello!", False, "", "Hello!"),
    ("Still thinking, cut off", True, "Still thinking, cut off", ""),
    ("<think>a</think>b</think>c", False, "a", "b</think>c"),
]


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), CASES)
def test_the_whole_answer_splits(text, opened, reasoning, content):
    assert split_reasoning(text, opened) == (reasoning, content)


def _streamed(pieces: list[str], opened: bool) -> tuple[str, str]:
    s = ReasoningSplitter(opened)
    r, c = "", ""
    for p in pieces:
        dr, dc = s.push(p)
        assert not dr.endswith(("<", "</", "</th"))  # no part of a closing tag shown
        r, c = r + dr, c + dc
    dr, dc = s.finish()
    return r + dr, c + dc


@pytest.mark.parametrize(("text", "opened", "reasoning", "content"), CASES)
def test_every_chunk_boundary_streams_to_the_same_split(text, opened, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert _streamed([text[:i], text[i:j], text[j:]], opened) == (reasoning, content)
    assert _streamed(list(text), opened) == (reasoning, content)


def test_a_partial_closing_tag_is_held_back():
    s = ReasoningSplitter(opened=True)
    assert s.push("hmm </thi") == ("hmm ", "")
    assert s.push("nk>Hi") == ("", "Hi")


def test_forced_open_is_read_from_the_prompt():
    assert forced_open("<|im_start|>assistant\n<think>\n")
    assert forced_open("<｜Assistant｜><think>\n")
    assert not forced_open("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not forced_open("<|im_start|>assistant\n")
    assert template_thinks("{{ '<think>\\n' }}") and not template_thinks(None)


@pytest.fixture
def eng(server):
    """The shared server's engine (SmolLM2)."""
    return server.engine


def test_engine_chat_returns_the_answer_with_the_reasoning_apart(eng, monkeypatch):
    from powerinfer_rs.runtime.reasoning import ChatReply

    template = "{% for m in messages %}{{ m.content }}\n{% endfor %}<think>\n"
    monkeypatch.setattr(eng.loaded, "chat_template", template)
    monkeypatch.setattr(eng, "generate", lambda prompt, **kw: "Hmm.\n</think>\n\nHi!")
    reply = eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=4)
    assert isinstance(reply, ChatReply) and isinstance(reply, str)
    assert (reply, reply.reasoning, reply.content) == ("Hi!", "Hmm.", "Hi!")
    whole = eng.chat([{"role": "user", "content": "hi"}], reasoning_format="none")
    assert (whole, whole.reasoning) == ("Hmm.\n</think>\n\nHi!", "")


def test_engine_chat_of_a_template_that_does_not_think_is_unchanged(eng):
    reply = eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=3, temperature=0)
    assert reply.reasoning == "" and reply == eng.generate(
        eng.format_chat([{"role": "user", "content": "hi"}]), max_new_tokens=3, temperature=0
    )


# -- gpt-oss harmony -------------------------------------------------------------------------

HARMONY = [
    # (model output after "<|start|>assistant", reasoning, content)
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>"
     "Hi!", "Think.", "Hi!"),
    ("<|channel|>final<|message|>Hi <|en", "", "Hi <|en"),  # a cut-off tag is text at the end
    ("<|channel|>analysis<|message|>Still thinking", "Still thinking", ""),  # cut off
    ("Plain text, no channels.", "", "Plain text, no channels."),
    ("<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Done.", "", "Let me look.Done."),  # a preamble to the user is content
]  # fmt: skip


@pytest.mark.parametrize(("text", "reasoning", "content"), HARMONY)
def test_harmony_channels_split_whole_and_at_every_boundary(text, reasoning, content):
    from powerinfer_rs.runtime.harmony import HarmonySplitter

    def run(pieces):
        s = HarmonySplitter()
        r, c = "", ""
        for p in pieces:
            dr, dc = s.push(p)
            assert "<|end|>" not in dc + dr and "<|message|>" not in dc + dr
            r, c = r + dr, c + dc
        dr, dc = s.finish()
        return r + dr, c + dc

    assert run([text]) == (reasoning, content)
    for i in range(len(text) + 1):
        assert run([text[:i], text[i:]]) == (reasoning, content), i
    assert run(list(text)) == (reasoning, content)
