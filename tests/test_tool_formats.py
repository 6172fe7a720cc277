"""Each tool-call family on transcripts in the exact text its real chat template produces
(tests/chat_templates/, see SOURCES.md): a conversation with tools and an assistant message
with calls is rendered through the template, and the assistant turn's text (what follows the
generation prompt, less the end-of-turn token that ends generation) is the transcript a model
of the family writes. Each is parsed whole and streamed at every chunk boundary (the same
calls, content and reasoning, no call text shown), its history renders back, and a required
call's forced prefix and grammar follow the family's syntax."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerinfer_rs.runtime.chat import format_chat
from powerinfer_rs.runtime.reasoning import splitter_of, template_thinks
from powerinfer_rs.runtime.tools import (
    ToolCallStream,
    parse_tool_calls,
    prompt_messages,
    tool_format,
)

TEMPLATES = Path(__file__).parent / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}  # fmt: skip
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ARGS = {"city": "Paris", "days": 3, "metric": True}
CALLS = [("get_weather", ARGS), ("get_time", {"zone": "CET"})]
#: The family each template is detected as, and whether it writes several calls per message.
FAMILIES = {
    "qwen3-coder": ("qwen3-coder", True),
    "glm-4.6": ("glm-4.5", True),
    "deepseek-r1": ("deepseek-r1", True),
    "deepseek-v3.1": ("deepseek-v3.1", True),
    "kimi-k2": ("kimi-k2", True),
    "gpt-oss": ("gpt-oss", False),
}
#: The token that ends each family's call turn (it ends generation: not in the model's text).
TURN_END = {"qwen3-coder": "<|im_end|>", "glm-4.6": "<|observation|>",
            "deepseek-r1": "<｜end▁of▁sentence｜>", "deepseek-v3.1": "<｜end▁of▁sentence｜>",
            "kimi-k2": "<|im_end|>", "gpt-oss": "<|call|>"}  # fmt: skip
THOUGHT = "The user wants the weather; I call the tool."


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


def render(tpl: str, history: list[dict], generation_prompt: bool) -> str:
    msgs, extra = prompt_messages(history, TOOLS, tpl)
    return format_chat(tpl, msgs, add_generation_prompt=generation_prompt, **extra)


def call_message(calls: list[tuple[str, dict]], thought: str = "") -> dict:
    msg = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}  # fmt: skip
    if thought:
        msg["reasoning_content"] = msg["thinking"] = thought
    return msg


def transcript(name: str, calls: list[tuple[str, dict]], thought: str = "") -> tuple[str, str]:
    """``(prompt, what the model writes)``: the rendered assistant turn after the generation
    prompt. Where the prompt opened a think block the template does not render for calls
    (DeepSeek-R1's ``<think>\\n``), the model's reasoning and ``</think>`` lead."""
    tpl = template(name)
    prompt = render(tpl, ASK, True)
    answered = [*ASK, call_message(calls, thought),
                *({"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"}
                  for i in range(len(calls)))]  # fmt: skip
    full = render(tpl, answered, False)
    common = 0
    while common < min(len(prompt), len(full)) and prompt[common] == full[common]:
        common += 1
    if prompt[common:]:  # the prompt goes on differently: from the start of that tag
        common = prompt.rfind("<", 0, common + 1)
    text = full[common:]
    text = text[: text.index(TURN_END[name])].rstrip("\n")
    if prompt[common:].strip() == "<think>":
        text = f"{thought}\n</think>\n\n{text}"
    return prompt, text


def split(name: str, prompt: str, text: str, pieces: list[str] | None = None):
    """``(reasoning, content, calls, shown)`` of ``text`` through the reasoning splitter (for
    a thinking template) and the family's call stream; ``shown``: the content deltas."""
    tpl = template(name)
    think = splitter_of(tpl, prompt) if template_thinks(tpl) else None
    stream = ToolCallStream(TOOLS, tool_format(tpl))
    reasoning, shown = "", []
    for piece in pieces if pieces is not None else [text]:
        r, c = think.push(piece) if think else ("", piece)
        reasoning += r
        shown.append(stream.push(c) if c else "")
    if think:
        r, c = think.finish()
        reasoning += r
        shown.append(stream.push(c) if c else "")
    rest, calls = stream.finish()
    shown.append(rest)
    return reasoning, "".join(shown), [(c.name, c.arguments) for c in calls], shown


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_template_is_detected_as_its_family(name):
    assert tool_format(template(name)).name == FAMILIES[name][0]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_templates_transcript_parses_to_its_calls(name):
    calls = CALLS if FAMILIES[name][1] else CALLS[:1]
    prompt, text = transcript(name, calls)
    reasoning, content, got, _ = split(name, prompt, text)
    assert got == calls, text
    assert content == "" and reasoning in ("", THOUGHT), (reasoning, content)
    fmt = tool_format(template(name))
    assert [(c.name, c.arguments) for c in parse_tool_calls(text, TOOLS, fmt)[1]] == calls


@pytest.mark.parametrize("name", ["glm-4.6", "deepseek-r1", "gpt-oss"])
def test_the_reasoning_before_a_call_is_reasoning(name):
    prompt, text = transcript(name, CALLS[:1], THOUGHT)
    assert THOUGHT in text
    reasoning, content, got, _ = split(name, prompt, text)
    assert (reasoning, content, got) == (THOUGHT, "", CALLS[:1])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_chunk_boundary_streams_the_same_and_shows_no_call(name):
    calls = CALLS if FAMILIES[name][1] else CALLS[:1]
    prompt, text = transcript(name, calls, THOUGHT if template_thinks(template(name)) else "")
    text = "Let me check.\n" + text if name in ("qwen3-coder", "kimi-k2") else text
    whole = split(name, prompt, text)[:3]
    assert whole[2] == calls
    for i in range(0, len(text) + 1, 3):
        for j in range(i, len(text) + 1, 11):
            got = split(name, prompt, text, [text[:i], text[i:j], text[j:]])
            assert got[:3] == whole, (i, j)
    got = split(name, prompt, text, list(text))
    assert got[:3] == whole
    assert not any(m in got[1] for m in tool_format(template(name)).markers)


def test_gpt_oss_as_the_model_writes_it_analysis_then_a_call_or_a_final_answer():
    """The model writes the recipient after the channel and ``<|constrain|>json``; an answer
    without calls is its final channel, the analysis its reasoning."""
    name, prompt = "gpt-oss", render(template("gpt-oss"), ASK, True)
    assert prompt.endswith("<|start|>assistant")
    text = (
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
    )
    assert split(name, prompt, text)[:3] == (THOUGHT, "", [("get_weather", {"city": "Paris"})])
    final = f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final" \
            "<|message|>It is sunny in Paris."  # fmt: skip
    for pieces in ([final], list(final)):
        reasoning, content, calls, shown = split(name, prompt, final, pieces)
        assert (reasoning, content, calls) == (THOUGHT, "It is sunny in Paris.", [])
        assert not any("<|" in s for s in shown)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_history_with_calls_and_results_renders_through_each_template(name):
    tpl = template(name)
    calls = CALLS if FAMILIES[name][1] else CALLS[:1]
    history = [*ASK, call_message(calls),
               *({"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}"}
                 for i in range(len(calls))),
               {"role": "assistant", "content": "It is sunny."},
               {"role": "user", "content": "And tomorrow?"}]  # fmt: skip
    text = render(tpl, history, True)
    assert "result 0" in text and "get_weather" in text and "Paris" in text
    assert "And tomorrow?" in text
    if name.startswith("deepseek"):  # the template renders no tools: our prompt in its syntax
        assert "<｜tool▁sep｜>" in text.split("<｜User｜>")[0]


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("named", [None, "get_weather"])
def test_a_forced_call_starts_in_the_familys_syntax(name, named):
    """The forced prefix is the start of the call the template writes, and the prefix plus
    the rest of the template's transcript parses back to the call."""
    fmt = tool_format(template(name))
    prompt, text = transcript(name, CALLS[:1])
    prefix, grammar = fmt.force(TOOLS, named)
    assert grammar.kind == "lark"
    at = text.find(prefix.split("\n")[0][:12]) if name != "gpt-oss" else 0
    if name != "gpt-oss":
        assert text[at:].startswith(prefix), (text, prefix)
        rest = text[at + len(prefix) :]
    else:  # the model's form (the recipient after the channel), as the prefix writes it
        rest = ("get_weather <|constrain|>json<|message|>" if named is None else "") + \
            json.dumps(ARGS)  # fmt: skip
    got = parse_tool_calls(prefix + rest, TOOLS, fmt)[1]
    assert [(c.name, c.arguments) for c in got] == CALLS[:1]


TEXT_GRAMMARS = ["qwen3-coder", "glm-4.6", "deepseek-r1"]


@pytest.mark.parametrize("name", TEXT_GRAMMARS)
@pytest.mark.parametrize("named", [None, "get_weather"])
def test_the_forced_grammar_accepts_the_templates_own_call(server, name, named):
    """For families whose call after the prefix is plain text, the grammar engine (on
    SmolLM2's vocabulary) accepts the template's exact call text and ends there."""
    llg = pytest.importorskip("llguidance")
    from powerinfer_rs.runtime.constrain import ll_tokenizer

    fmt = tool_format(template(name))
    _, text = transcript(name, CALLS[:1])
    prefix, grammar = fmt.force(TOOLS, named)
    at = text.index(prefix)
    rest = text[at + len(prefix) :]
    if name == "deepseek-r1":
        rest = rest.split("<｜tool▁call▁end｜>")[0]
    tok = server.engine.tokenizer
    m = llg.LLMatcher(ll_tokenizer(tok, server.engine.config.vocab_size), grammar.compile())
    assert not m.is_error(), m.get_error()
    ids = tok.encode(rest, add_bos=False, special=False)
    assert m.consume_tokens(ids), (rest, m.get_error())
    assert m.is_accepting(), rest


@pytest.mark.parametrize(("name", "closing"), [("qwen3-coder", "</function>"),
                                               ("glm-4.6", "</tool_call>")])  # fmt: skip
def test_an_xml_call_cut_off_before_its_closing_tag_is_no_call(name, closing):
    prompt, text = transcript(name, CALLS[:1])
    cut = text[: text.rindex(closing)]
    fmt = tool_format(template(name))
    assert parse_tool_calls(text, TOOLS, fmt)[1]
    assert parse_tool_calls(cut, TOOLS, fmt) == (cut, [])
