"""The incremental prompt tokenization gives exactly the ids of a full tokenization, turn after turn, on chats
full of what breaks tokenizers (whitespace runs, CJK, emoji, combining marks, special-token text typed by the
user), and reuses the earlier ids where it can (model_loader.prompt_encoding)."""

import random


from model_loader.chat import ChatFormat, history_content
from model_loader.common_prefix import common_prefix
from model_loader.prompt_encoding import IncrementalEncoder

PIECES = [
    "the",
    " model",
    "  ",
    "\n",
    "\n\n",
    "\t",
    " ",
    "def f(x):",
    "    return x*x",
    "你好",
    "世界",
    "🎉",
    "👩‍💻",
    "e\u0301",
    "\u0301",
    "123",
    "4567",
    "<｜User｜>",
    "<｜Assistant｜>",
    "</think>",
    "<think>",
    "<｜Us",
    "｜>",
    "<|im_end|>",
    "<",
    ">",
    "'s",
    " don't",
    "ＡＢ",
    "ﬁ",
    "…",
    "$x^2$",
    "```python\n",
    "```",
]


def text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, n)))


def test_common_prefix_of_strings():
    assert common_prefix("", "abc") == 0
    assert common_prefix("abc", "abc") == 3
    assert common_prefix("abcd", "abxd") == 2
    assert common_prefix("ab", "abc") == 2
    assert common_prefix("你好世界", "你好世") == 3


def test_same_ids_as_a_full_tokenization_over_random_chats(chat):
    """Conversations as the window makes them: follow-ups (with the reply's reasoning dropped), regenerations,
    an edited last message, a changed system prompt, a switch to another chat."""
    tok = chat.tokenizer
    encoder = chat.prompt_encoder
    assert encoder is not None
    rng = random.Random(0)
    reused = checked = 0
    for conversation in range(40):
        messages = [{"role": "system", "content": text(rng, 12)}] if rng.random() < 0.3 else []
        messages.append({"role": "user", "content": text(rng, 30)})
        for turn in range(6):
            # the prompt text as the window renders it, tokenized by the encoder (render itself tokenizes a
            # message holding control-token text piecewise: test_tokenizer_control_tokens covers that)
            prompt = chat.render(messages)
            ids = encoder.encode(prompt.text)
            assert ids == tok.encode(prompt.text, add_special_tokens=False), (conversation, turn)
            reused += encoder.reused_ids
            checked += 1
            action = rng.random()
            if action < 0.6:  # the reply, then a follow-up
                messages.append(
                    {"role": "assistant", "content": f"<think>\n{text(rng, 40)}\n</think>\n\n" + text(rng, 30)}
                )
                messages.append({"role": "user", "content": text(rng, 20)})
            elif action < 0.75:  # regenerate: the same prompt again
                pass
            elif action < 0.9:  # edit the last user message
                messages[-1] = {"role": "user", "content": messages[-1]["content"] + text(rng, 5)}
            elif messages[0]["role"] == "system":  # change the system prompt: little is shared
                messages[0] = {"role": "system", "content": text(rng, 12)}
    assert checked == 240 and reused > 0


def test_follow_ups_tokenize_only_what_is_new(chat):
    encoder = chat.prompt_encoder
    long_history = "word " * 3000
    first = chat.render([{"role": "user", "content": long_history}])
    second = chat.render(
        [
            {"role": "user", "content": long_history},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nAn answer."},
            {"role": "user", "content": "And then?"},
        ]
    )
    assert second.ids[: len(first.ids) - 3] == first.ids[: len(first.ids) - 3]
    # all of the long first message is reused: the cut is at the <｜Assistant｜> after it
    assert encoder.reused_ids >= len(first.ids) - 3 >= 3000
    assert second.ids == chat.tokenizer.encode(second.text, add_special_tokens=False)


def test_a_tokenizer_with_stripping_and_overlapping_added_tokens():
    """An added token that eats the whitespace beside it (lstrip/rstrip) or only matches whole words depends on
    the text around it: never a cut. Added tokens that overlap ("<P>" inside "b<P>", "<P>x" and "a<P>b") make a
    token that the new text completes take a cut token's place ("a<P>" then "b"): the ids still equal a full
    tokenization."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(set("abc xyz\n ")))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(
        [
            AddedToken("<L>", lstrip=True),
            AddedToken("<R>", rstrip=True),
            AddedToken("<W>", single_word=True),
            AddedToken("<P>"),
            AddedToken("b<P>"),
            AddedToken("<P>x"),
            AddedToken("a<P>b"),
        ]
    )
    encoder = IncrementalEncoder(tok)
    assert {tok.id_to_token(i) for i in encoder._cut_tokens} == {"<P>", "b<P>", "<P>x", "a<P>b"}
    for text in ["a<P>y", "a<P>b"]:  # the second completes "a<P>b" over the first's cut at "<P>"
        assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids, text
    rng = random.Random(1)
    pieces = ["a", "b", "x", " ", "  ", "\n", "<L>", "<R>", "<W>", "<P>", "<P>", "x<W>", "<W>y", "<", ">", "P"]
    base = ""
    reused = 0
    for _ in range(3000):
        base = base[: rng.randint(0, len(base))] + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert encoder.encode(base) == tok.encode(base, add_special_tokens=False).ids, repr(base)
        reused += encoder.reused_ids
    assert reused > 0


def test_a_finished_reply_is_tokenized_before_the_follow_up_asks(cpu_engine):
    """After a reply the engine tokenizes the history with it as the window sends it back (while the user
    reads), so the follow-up's render reuses all of that but its last token (the cut), not only the previous
    prompt's ids; the ids are still a full tokenization's."""
    from model_loader.events import Finished, GenerationControl, SamplingSettings

    chat = cpu_engine.chat
    messages = [{"role": "user", "content": "Say something long."}]
    settings = SamplingSettings(temperature=0, max_new_tokens=24, ignore_eos=True)
    control = GenerationControl()
    control.stop_thinking()  # the random model never closes its reasoning: close it, so an answer follows
    final = [ev for ev in cpu_engine.generate(messages, settings, control) if isinstance(ev, Finished)][0]
    assert final.reasoning and final.answer
    history = [*messages, {"role": "assistant", "content": history_content(final.text, final.reasoning, final.answer)}]
    ahead = chat.tokenizer.encode(chat._template_text(history, add_generation_prompt=False))
    prompt = chat.render([*history, {"role": "user", "content": "And?"}])
    assert prompt.ids == chat.tokenizer.encode(prompt.text, add_special_tokens=False)
    assert chat.prompt_encoder.reused_ids == len(ahead) - 1  # all of it, up to its closing end-of-sentence


def _char_tokenizer(chars: str):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=chars[0]))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return tok


def _same_ids_turn_after_turn(tok, texts):
    encoder = IncrementalEncoder(tok)
    for text in texts:
        assert encoder.encode(text) == tok.encode(text, add_special_tokens=False).ids, text


def test_offsets_a_post_processor_trims_are_not_taken_for_a_cut():
    """ByteLevel's trim_offsets moves a token's offsets past its leading space: the cut is checked against the
    text, not taken from the offsets."""
    from tokenizers import AddedToken, processors

    tok = _char_tokenizer("abcd <>T")
    tok.add_special_tokens([AddedToken(" <T>", normalized=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    _same_ids_turn_after_turn(tok, ["ab <T>c", "ab <T>cd"])


def test_an_added_tokens_id_that_the_model_can_also_produce_is_no_cut():
    """A BPE vocabulary that holds "<P>" itself, and NFKC mapping "＜P＞" onto it: that id can come out of the model
    anywhere, so it marks no place where the tokenizer cut the text."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers

    vocab = {"x": 0, "<": 1, "P": 2, ">": 3, "y": 4, "<P": 5, ">y": 6, "<P>": 7, "x<P": 8}
    merges = [("<", "P"), (">", "y"), ("<P", ">"), ("x", "<P")]
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.normalizer = normalizers.NFKC()
    tok.add_tokens([AddedToken("<P>", normalized=False)])
    _same_ids_turn_after_turn(tok, ["x＜P＞", "x＜P＞y"])


def test_tokens_added_after_the_encoder_was_made_are_seen():
    from tokenizers import AddedToken

    tok = _char_tokenizer("abcd <>T")
    tok.add_special_tokens([AddedToken("<T>", normalized=False)])
    encoder = IncrementalEncoder(tok)
    encoder.encode("a<T>")
    tok.add_special_tokens([AddedToken("a<T>b", normalized=False)])
    assert encoder.encode("a<T>b") == tok.encode("a<T>b", add_special_tokens=False).ids


def test_a_tokenizer_that_truncates_or_pads_tokenizes_every_prompt_whole(tmp_path):
    """Truncation or padding in tokenizer.json would apply to the rest of a text on its own, and special tokens
    encoded as text mark no cut: no incremental encoder then."""
    from tokenizers import AddedToken

    from model_loader.tokenizer import FolderTokenizer

    tok = _char_tokenizer("abcd <>T")
    tok.add_special_tokens([AddedToken("<T>", normalized=False)])
    assert IncrementalEncoder.usable(tok)
    tok.encode_special_tokens = True  # added tokens tokenized as text: none is a cut
    assert not IncrementalEncoder.usable(tok)
    tok.encode_special_tokens = False
    tok.enable_padding(length=8)
    assert not IncrementalEncoder.usable(tok)
    tok.no_padding()
    tok.enable_truncation(4)
    assert not IncrementalEncoder.usable(tok)
    tok.save(str(tmp_path / "tokenizer.json"))
    folder = FolderTokenizer(tmp_path)
    assert folder.prompt_encoder() is None
    chat = ChatFormat(folder, [])
    assert chat.prompt_encoder is None


def test_a_failure_to_tokenize_ahead_does_not_fail_the_finished_reply(cpu_engine, monkeypatch):
    from model_loader.errors import ModelError
    from model_loader.events import Finished, SamplingSettings

    def broken(messages):
        raise ModelError("chat template failed: a template that only renders with a user message last")

    monkeypatch.setattr(cpu_engine.chat, "prepare", broken)
    settings = SamplingSettings(temperature=0, max_new_tokens=4, ignore_eos=True)
    events = list(cpu_engine.generate([{"role": "user", "content": "Hi"}], settings))  # read to the end: no raise
    assert isinstance(events[-1], Finished) and events[-1].stats.completion_tokens == 4
