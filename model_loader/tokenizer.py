"""The model folder's tokenizer and chat template, loaded with the `tokenizers` library and a sandboxed Jinja
environment (what transformers itself uses underneath), so starting the app does not import transformers:
that import alone costs seconds, most of the time to ready. Folders without tokenizer.json fall back
to transformers' AutoTokenizer (local files only, never remote code).

The object exposes the small slice of the transformers tokenizer API the engine uses.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from model_loader.errors import ModelError


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def _template_from(config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return template


def _jinja_env():
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **_: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class FolderTokenizer:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja) of a model folder."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_path = folder / "tokenizer_config.json"
        config = {}
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
        self.chat_template = _template_from(config)
        jinja_file = folder / "chat_template.jinja"
        if jinja_file.is_file():
            self.chat_template = jinja_file.read_text(encoding="utf-8")
        elif (folder / "chat_template.json").is_file():
            self.chat_template = _template_from(json.loads((folder / "chat_template.json").read_text("utf-8")))
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self._env = None
        self._added: frozenset[int] | None = None
        self._compiled: dict[str, object] = {}  # template source -> compiled template

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's string for an id (byte-level characters for BPE pieces)."""
        return self._tok.id_to_token(token_id)

    def added_token_ids(self) -> frozenset[int]:
        """Ids of the added tokens (control tokens and the like), whose strings are their text as written."""
        if self._added is None:
            self._added = frozenset(self._tok.get_added_tokens_decoder())
        return self._added

    def control_strings(self) -> list[str]:
        """The text of every added token (<｜User｜>, <think>, ...): what typed into a message would become a
        control token if the prompt were tokenized as one string."""
        return [t.content for t in self._tok.get_added_tokens_decoder().values() if t.content]

    def encode_text(self, text: str) -> list[int]:
        """Text as text: the ids the tokenizer gives it with no added tokens matched (typed "<｜Assistant｜>"
        stays those characters), as llama.cpp tokenizes user text (parse_special off)."""
        return encode_text_only(self._tok, text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def prompt_encoder(self):
        """An encoder for chat prompts that reuses the last prompt's ids (model_loader.prompt_encoding), or None
        where this tokenizer.json's settings rule it out."""
        from model_loader.prompt_encoding import IncrementalEncoder

        return IncrementalEncoder(self._tok) if IncrementalEncoder.usable(self._tok) else None

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages, chat_template=None, add_generation_prompt=False, tokenize=False, **variables
    ):
        """variables: more the template may read (tools)."""
        source = chat_template or self.chat_template
        template = self._compiled.get(source)
        if template is None:  # compiling (parse + codegen) costs more than a render: once per template, not per reply
            if self._env is None:
                self._env = _jinja_env()
            template = self._compiled[source] = self._env.from_string(source)
        text = template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **variables,
        )
        return self.encode(text) if tokenize else text


def encode_text_only(tok, text: str) -> list[int]:
    """A `tokenizers.Tokenizer`'s own steps (normalizer, pre-tokenizer, model) without its added-token pass."""
    normalized = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
    pieces = tok.pre_tokenizer.pre_tokenize_str(normalized) if tok.pre_tokenizer is not None else [(normalized, None)]
    return [t.id for piece, _ in pieces for t in tok.model.tokenize(piece)]


def check_vocabulary(tokenizer, cfg, folder: Path) -> None:
    """The tokenizer's ids must all have rows in the model's embedding: a token past it (a tokenizer from
    another model) would index out of range on the first prompt, which on a GPU is a device-side assert that
    leaves CUDA unusable until the app restarts."""
    largest = len(tokenizer) - 1  # ids run 0..n-1 (added tokens included); get_vocab() would build a whole dict
    if largest >= cfg.vocab_size:
        raise ModelError(
            f"{folder}: the tokenizer (tokenizer.json) has token ids up to {largest}, but config.json's "
            f"vocab_size is {cfg.vocab_size}: the tokenizer and the weights are from different models",
            str(folder),
        )


def load_tokenizer(folder: Path):
    try:
        if (folder / "tokenizer.json").is_file():
            return FolderTokenizer(folder)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except ModelError:
        raise
    except Exception as err:
        first_line = (str(err).splitlines() or [err.__class__.__name__])[0][:200]
        raise ModelError(f"{folder}: could not load the tokenizer ({first_line})", str(folder)) from err
