"""A chat template in place of the model's (``chat_template=``, ``--chat-template-file``): chat
renders with it, the reasoning split follows it, and a bad one fails at startup naming itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from powerinfer_rs import Engine
from powerinfer_rs.errors import ModelFileError
from powerinfer_rs.runtime.chat_template_file import read_chat_template

#: A template nobody ships: its marks prove it rendered; it opens a think block (forced open).
TEMPLATE = (
    "{% for m in messages %}[[{{ m['role'] }}]]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[[assistant]]<think>\n{% endif %}"
)
MESSAGES = [{"role": "user", "content": "hi"}]


def test_the_template_given_renders_and_drives_the_reasoning_split(synth_gguf):
    path = synth_gguf()
    own = Engine.from_pretrained(path, threads=1)
    eng = Engine.from_pretrained(path, threads=1, chat_template=TEMPLATE)
    assert eng.format_chat(MESSAGES) == "[[user]]hi\n[[assistant]]<think>\n"
    assert "[[user]]" not in own.format_chat(MESSAGES)
    # The template opens a think block, so what the model writes (it never closes one) is
    # reasoning, not content: the splitter reads the template given, not the file's.
    reply = eng.chat(MESSAGES, max_new_tokens=4, temperature=0.0)
    assert str(reply) == reply.content == "" and reply.reasoning
    assert not own.chat(MESSAGES, max_new_tokens=4, temperature=0.0).reasoning


@pytest.mark.parametrize(
    "template, says",
    [("{% if %}", "does not compile"), ("  \n", "is empty"), (b"{{ x }}", "a str")],
)
def test_a_bad_template_is_refused_at_startup(synth_gguf, template, says):
    with pytest.raises(ModelFileError, match=says):
        Engine.from_pretrained(synth_gguf(), threads=1, chat_template=template)


def test_the_file_is_read_and_checked(tmp_path):
    good = tmp_path / "t.jinja"
    good.write_text(TEMPLATE, encoding="utf-8")
    assert read_chat_template(good) == TEMPLATE
    (tmp_path / "bad.jinja").write_bytes(b"\xff\xfe{{ x }}")
    (tmp_path / "broken.jinja").write_text("{% for %}", encoding="utf-8")
    for name, says in [("bad", "not UTF-8"), ("broken", "does not compile"), ("none", "cannot")]:
        with pytest.raises(ModelFileError, match=f"{name}.jinja.*{says}"):
            read_chat_template(tmp_path / f"{name}.jinja")


def test_the_command_line_takes_the_file(synth_gguf, tmp_path):
    tpl = tmp_path / "t.jinja"
    tpl.write_text(TEMPLATE, encoding="utf-8")
    path = synth_gguf()
    run = [sys.executable, "-m", "powerinfer_rs", "generate", "--model", str(path)]
    args = ["-t", "1", "-n", "2", "--chat", "-p", "hi", "--chat-template-file"]
    ok = subprocess.run([*run, *args, str(tpl)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    # The prompt the command ran is the one this template renders (its token count).
    eng = Engine.from_pretrained(path, threads=1, chat_template=TEMPLATE)
    n = len(eng.tokenizer.encode(eng.format_chat(MESSAGES)))
    own = len(eng.tokenizer.encode(Engine.from_pretrained(path, threads=1).format_chat(MESSAGES)))
    assert f"[prompt {n} tok," in ok.stderr and n != own
    missing = subprocess.run(
        [*run, *args, str(tmp_path / "no.jinja")], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode != 0 and "no.jinja" in missing.stderr
    assert "Traceback" not in missing.stderr
