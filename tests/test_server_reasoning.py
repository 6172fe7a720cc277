"""Reasoning in the server's answers: a ``<think>`` template's answer split into
``reasoning_content`` and ``content`` (streamed as its own deltas), read back by the real
``openai`` client; ``chat_template_kwargs`` reaching the template; ``--reasoning-format none``.

SmolLM2 does not think, so the template is a thinking one (forced-open as DeepSeek-R1's, the
block closed empty with ``enable_thinking`` false as Qwen3's) and the model's output is a
scripted transcript, one character per step."""

from __future__ import annotations

import pytest

from powerinfer_rs.runtime.generation import GenerationStats
from powerinfer_rs.runtime.streaming import TokenStep, TokenStream

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
#: Qwen3's generation prompt: the model opens its own block; an empty one closed when off.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
THOUGHT = "The user says hi. </thinking> is not the tag.\nI greet back."
ANSWER = "Hello! How can I help?"
ASK = [{"role": "user", "content": "hi"}]


def scripted(prompt, **kwargs):
    """The transcript a thinking model writes after ``prompt``: reasoning closed by
    ``</think>`` when the prompt opened the block, else the answer alone."""
    if prompt.endswith("<think>\n"):  # forced open
        text = f"{THOUGHT}\n</think>\n\n{ANSWER}"
    elif prompt.endswith("</think>\n\n"):  # thinking off
        text = ANSWER
    else:
        text = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
    stats = GenerationStats(prompt_tokens=3, finish_reason="eos", completion_tokens=len(text))
    return TokenStream((TokenStep(i, c) for i, c in enumerate(text)), stats)


@pytest.fixture(params=["forced-open", "qwen3"])
def thinking(server, monkeypatch, request):
    template = THINK_TEMPLATE if request.param == "forced-open" else QWEN3_TEMPLATE
    monkeypatch.setattr(server.engine.loaded, "chat_template", template)
    monkeypatch.setattr(server.engine, "stream_tokens", scripted)
    return server


def test_the_reasoning_is_reasoning_content_not_content(thinking):
    r = thinking.client().chat.completions.create(model="smollm2", messages=ASK)
    msg = r.choices[0].message
    assert msg.content == ANSWER
    assert msg.reasoning_content == THOUGHT  # an extra field on the client's pydantic model


def test_the_stream_sends_reasoning_deltas_then_content(thinking):
    stream = thinking.client().chat.completions.create(model="smollm2", messages=ASK,
                                                       stream=True)  # fmt: skip
    reasoning, content, order = "", "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        r = getattr(delta, "reasoning_content", None) or ""
        reasoning += r
        content += delta.content or ""
        if r or delta.content:
            order.append("r" if r else "c")
    assert (reasoning, content) == (THOUGHT, ANSWER)
    assert order == sorted(order, reverse=True)  # all reasoning first
    assert "</think>" not in reasoning + content


def test_chat_template_kwargs_reach_the_template(thinking):
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"}
    r = thinking.client().chat.completions.create(model="smollm2", messages=ASK,
                                                  extra_body=kwargs)  # fmt: skip
    msg = r.choices[0].message
    assert msg.content == ANSWER and not getattr(msg, "reasoning_content", None)


def test_reasoning_format_none_keeps_everything_in_content(thinking, monkeypatch):
    monkeypatch.setattr(thinking.state, "reasoning_format", "none")
    r = thinking.client().chat.completions.create(model="smollm2", messages=ASK)
    msg = r.choices[0].message
    assert msg.content.endswith(f"{THOUGHT}\n</think>\n\n{ANSWER}")
    assert getattr(msg, "reasoning_content", None) is None


def _anthropic(server):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


def test_messages_put_the_reasoning_in_a_thinking_block_first(thinking):
    r = _anthropic(thinking).messages.create(model="smollm2", max_tokens=64, messages=ASK)
    assert [b.type for b in r.content] == ["thinking", "text"]
    assert (r.content[0].thinking, r.content[1].text) == (THOUGHT, ANSWER)
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in r.content]},
               {"role": "user", "content": "and?"}]  # fmt: skip
    again = _anthropic(thinking).messages.create(model="smollm2", max_tokens=64,
                                                 messages=history)  # fmt: skip
    assert again.content[-1].text == ANSWER  # a thinking block in the history is taken


def test_messages_stream_thinking_deltas_then_text(thinking):
    client = _anthropic(thinking)
    with client.messages.stream(model="smollm2", max_tokens=64, messages=ASK) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds == sorted(kinds, reverse=True) and set(kinds) == {"thinking_delta", "text_delta"}
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert (final.content[0].thinking, final.content[1].text) == (THOUGHT, ANSWER)


def test_messages_thinking_disabled_renders_without_thinking(thinking):
    r = _anthropic(thinking).messages.create(
        model="smollm2", max_tokens=64, messages=ASK, thinking={"type": "disabled"}
    )
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == ANSWER


def test_reasoning_budget_zero_renders_without_thinking(thinking, monkeypatch):
    monkeypatch.setattr(thinking.state, "reasoning_budget", 0)
    msg = thinking.client().chat.completions.create(model="smollm2", messages=ASK).choices[0]
    assert msg.message.content == ANSWER and not getattr(msg.message, "reasoning_content", None)


def test_a_bad_reasoning_format_fails_at_startup(server):
    from powerinfer_rs.server.app import create_app

    with pytest.raises(ValueError, match="reasoning format"):
        create_app(server.engine, model_id="m", reasoning_format="deepseek")


def test_chat_template_kwargs_may_not_set_what_the_server_sets(server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model="smollm2", messages=ASK, extra_body={"chat_template_kwargs": {"bos_token": "x"}}
        )
    assert e.value.body["param"] == "chat_template_kwargs"
