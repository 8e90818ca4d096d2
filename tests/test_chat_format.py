"""Prompt rendering, the streaming detokenizer and the reasoning/answer split, on hand-made inputs."""

import json
import shutil

import pytest

from model_loader.chat import ChatFormat, ReasoningSplitter, StreamingDetokenizer, answer_only
from model_loader.tokenizer import FolderTokenizer

BOS = "<｜begin▁of▁sentence｜>"


def split(stream, in_reasoning=True):
    s = ReasoningSplitter(in_reasoning)
    out = []
    for piece in stream:
        out += s.feed(piece)
    out += s.flush()
    merged = {"reasoning": "", "answer": ""}
    for kind, text in out:
        merged[kind] += text
    return merged, s


@pytest.mark.parametrize(
    "stream",
    [
        ["Let me think", ".", "\n</think>", "\n\nThe answer is 4."],
        ["Let me think.\n<", "/th", "ink>\n\nThe answer", " is 4."],
        ["Let me think.\n</", "think>", "\n\n", "The answer is 4."],
        ["Let me think.\n</think>\n\nThe answer is 4."],
        list("Let me think.\n</think>\n\nThe answer is 4."),
    ],
)
def test_reasoning_split_handles_the_close_tag_split_anywhere(stream):
    merged, s = split(stream)
    assert merged["reasoning"] == "Let me think.\n"
    assert merged["answer"].lstrip("\n") == "The answer is 4."
    assert not s.in_reasoning


def test_reply_that_never_closes_its_reasoning_stays_reasoning():
    merged, s = split(["I keep thinking", " about </thi", "ngs"])
    assert merged == {"reasoning": "I keep thinking about </things", "answer": ""}
    assert s.in_reasoning


def test_stray_leading_think_tag_is_dropped_and_later_tags_are_text():
    merged, _ = split(["<th", "ink>\nHmm", " x < y", "</think>ok"])
    assert merged == {"reasoning": "\nHmm x < y", "answer": "ok"}


def test_models_without_reasoning_are_all_answer():
    merged, _ = split(["Plain </think> answer"], in_reasoning=False)
    assert merged == {"reasoning": "", "answer": "Plain </think> answer"}


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "中文字符和日本語のテキスト",
        "emoji 🎉🦀👩‍👩‍👧 flags 🇯🇵",
        "mixed 数学 ∑ x² ≤ 1 and код на русском",
    ],
)
def test_streaming_detokenizer_never_emits_broken_characters(chat, text):
    ids = chat.encode_plain(text)
    detok = StreamingDetokenizer(chat.tokenizer)
    pieces = [detok.add(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    if "🎉" in text:  # the case has characters split over several tokens, which a naive decode breaks
        assert any("\ufffd" in chat.tokenizer.decode([i]) for i in ids)


def test_prompt_has_one_bos_the_generation_prompt_and_no_old_reasoning(chat):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "secret reasoning\n</think>\n\nHello!"},
        {"role": "user", "content": "2+2?"},
    ]
    p = chat.render(messages)
    assert p.text == (
        f"{BOS}<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜><think>\n"
    )
    assert p.starts_in_reasoning
    assert p.ids.count(151646) == 1 and p.ids[0] == 151646
    assert 151648 == p.ids[-2]  # <think> is one token
    assert "secret" not in p.text
    assert answer_only("a</think>\n\nb") == "b"


def test_system_prompt_goes_after_bos(chat):
    p = chat.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert p.text.startswith(BOS + "Be brief.<｜User｜>Hi")


@pytest.mark.parametrize("tokenizer_class,add_bos", [("LlamaTokenizerFast", True), ("Qwen2Tokenizer", False)])
def test_same_ids_as_transformers_whatever_the_tokenizer_config_says(tiny_model, tmp_path, tokenizer_class, add_bos):
    """DeepSeek's folder names LlamaTokenizerFast with add_bos_token; transformers 5 loads it as Qwen2Tokenizer
    and adds no BOS. Our prompt never depends on either: always one BOS, from the template."""
    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder)
    cfg = json.loads((tiny_model / "tokenizer_config.json").read_text())
    cfg.update(tokenizer_class=tokenizer_class, add_bos_token=add_bos)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    messages = [{"role": "user", "content": "héllo 世界 🎉 <think> literal"}]
    ours = ChatFormat(FolderTokenizer(folder), [151643]).render(messages)
    hf = ChatFormat(AutoTokenizer.from_pretrained(folder, local_files_only=True), [151643]).render(messages)
    assert ours.text == hf.text
    assert ours.ids == hf.ids
    assert ours.ids.count(151646) == 1


def test_folder_without_template_uses_the_builtin_r1_format(tiny_model, tmp_path):
    folder = tmp_path / "notemplate"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder)
    cfg = json.loads((tiny_model / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    p = ChatFormat(FolderTokenizer(folder), [151643]).render([{"role": "user", "content": "Hi"}])
    assert p.text == f"{BOS}<｜User｜>Hi<｜Assistant｜><think>\n"


def test_old_r1_template_without_think_gets_it_appended(tiny_model, tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder)
    cfg = json.loads((tiny_model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("<think>\\n", "")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    fmt = ChatFormat(FolderTokenizer(folder), [151643])
    p = fmt.render([{"role": "user", "content": "Hi"}])
    assert p.text.endswith("<｜Assistant｜><think>\n") and p.starts_in_reasoning
    # a message that mentions the tag near the end of the prompt: the tag was looked for in the prompt's last 64
    # characters, so the reasoning was not opened and all of it streamed as the answer
    for messages in (
        [{"role": "user", "content": "What does the <think> tag do?"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Use <think>."},
            {"role": "user", "content": "ok"},
        ],
    ):
        p = fmt.render(messages)
        assert p.text.endswith("<｜Assistant｜><think>\n") and p.starts_in_reasoning, p.text[-80:]


def test_an_answer_that_mentions_the_close_tag_goes_back_whole_for_a_model_that_does_not_reason(tiny_model, tmp_path):
    """Earlier replies were cut at their last </think> for every model, so a Qwen2.5's answer that mentions the
    tag lost everything before it, which its own template keeps. (R1's own template cuts at the last </think>
    by itself: DeepSeek's rule, left as it is.)"""
    folder = tmp_path / "plain"
    folder.mkdir()
    tok = json.loads((tiny_model / "tokenizer.json").read_text(encoding="utf-8"))
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] not in ("<think>", "</think>")]
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    cfg = json.loads((tiny_model / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {
        k: v for k, v in cfg.get("added_tokens_decoder", {}).items() if v.get("content") not in ("<think>", "</think>")
    }
    cfg["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    fmt = ChatFormat(FolderTokenizer(folder), [151643])
    assert not fmt.reasons
    answer = "R1 wraps its reasoning in <think>...</think>; strip everything up to it before display."
    p = fmt.render(
        [
            {"role": "user", "content": "How?"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "ok"},
        ]
    )
    assert answer in p.text
    # a reasoning model's raw reply (the API's clients send them back so): its answer starts after the first
    # </think>, where the streamed split puts it
    assert answer_only("thinking</think>\n\nUse </think> to close.") == "Use </think> to close."


def test_stop_ids_include_end_of_sentence(chat):
    assert 151643 in chat.stop_ids


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the classic escape to every class in the process
        "{{ raise_exception.__globals__ }}",  # a function's globals: the module, its imports, os
        "{{ messages.__class__.__init__ }}",
        "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}{{ messages }}",  # mutating the input
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_a_chat_template_reaching_outside_its_sandbox_is_refused(tiny_model, tmp_path, template):
    """Chat templates come with downloaded models: untrusted input. The Jinja sandbox must refuse attribute
    walks to Python internals (an error, or nothing rendered where they would be) and mutation of what it is
    given. A plain jinja2.Environment renders a function's globals, lists every class, even runs `id`."""
    import re

    from model_loader.errors import ModelError

    folder = tmp_path / "evil"
    folder.mkdir()
    shutil.copy(tiny_model / "tokenizer.json", folder)
    shutil.copy(tiny_model / "tokenizer_config.json", folder)
    (folder / "chat_template.jinja").write_text(template)
    fmt = ChatFormat(FolderTokenizer(folder), [151643])
    messages = [{"role": "user", "content": "Hi"}]
    try:
        prompt = fmt.render(messages)
    except ModelError as err:
        assert "chat template failed" in str(err)
    else:
        assert not re.search(r"<(class|function|module|built-in|bound method)|__|uid=", prompt.text), prompt.text
    assert messages == [{"role": "user", "content": "Hi"}]


def test_a_reply_is_stored_as_reasoning_close_tag_answer_once_its_reasoning_has_closed():
    from model_loader.chat import stored_reply

    assert stored_reply("Let me think.", "4", started_in_reasoning=True) == "Let me think.</think>\n\n4"
    # still reasoning (cut off, or stopped): no tag yet; closed with nothing after it: the tag
    assert stored_reply("Let me", "", started_in_reasoning=True) == "Let me"
    assert stored_reply("Done.", "", started_in_reasoning=True, reasoning_closed=True) == "Done.</think>\n\n"
    # a model (or a prompt) that doesn't open in its reasoning: the answer alone
    assert stored_reply("", "Hello", started_in_reasoning=False) == "Hello"
