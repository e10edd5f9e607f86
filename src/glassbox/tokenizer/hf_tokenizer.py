"""Tokenizer: a Hugging Face model directory's tokenizer (tokenizer.json + configs) and its chat template.

Wraps ``tokenizers.Tokenizer`` (the Rust library transformers uses) so that encode/decode give the same ids
and text as ``transformers.AutoTokenizer`` on the same directory, without importing transformers.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

from glassbox.models.config_reader import read_config
from glassbox.models.facts import id_list

logger = logging.getLogger(__name__)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """A special token given as a string or as an AddedToken dict {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pick_chat_template(value: Any) -> str | None:
    """A chat_template field: a string, or a list of {name, template} from which we take "default"."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        if isinstance(default, str):
            return default
        logger.warning("chat_template lists %s but no 'default'; using none", sorted(map(str, named)))
    return None


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (used by templates to mark assistant text): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja's built-in filter, no HTML escaping: the output goes to a model, not a web page.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def compile_chat_template(source: str) -> jinja2.Template:
    """Compile a chat template in a sandbox configured the way Hugging Face templates expect."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _content_text(content: Any, where: str) -> str:
    """Message content as a string: a string, or OpenAI-style [{"type": "text", "text": ...}] parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ValueError(f"{where}.content[{j}] must be a text part {{'type': 'text', 'text': str}}")
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError(
        f"{where}.content must be a string or a list of text parts, got {type(content).__name__}"
    )


def validate_messages(messages: Any) -> None:
    """Raise ValueError (naming the bad item) unless ``messages`` is a well-formed, non-empty chat."""
    if not isinstance(messages, list):
        raise ValueError(
            f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages must contain at least one message")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ValueError(
                f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(f"{where}.role must be one of {list(CHAT_ROLES)}, got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            continue  # an assistant turn that only calls tools
        if content is None:
            raise ValueError(f"{where} needs a 'content' (a string or a list of text parts)")
        _content_text(content, where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate, then return copies with content parts joined into strings and None-valued keys dropped."""
    validate_messages(messages)
    out = []
    for i, message in enumerate(messages):
        copy = {k: v for k, v in message.items() if v is not None}
        if "content" in copy:
            copy["content"] = _content_text(copy["content"], f"messages[{i}]")
        out.append(copy)
    return out


def _cut_after_final_message(text: str, final: Any) -> str:
    """``text`` up to the end of the last message's content (its last occurrence; stripped when the template
    strips messages, as Llama 3's does)."""
    if not isinstance(final, str) or not final.strip():
        raise ValueError("continue_final_message needs a last message with text content to continue")
    for piece in (final, final.strip()):
        at = text.rfind(piece)
        if at >= 0:
            return text[: at + len(piece)]
    raise ValueError("continue_final_message: the chat template does not render the last message's text")


class Tokenizer:
    """A model's tokenizer: encode/decode equal to transformers' fast tokenizer, plus its chat template.

    Build one with :meth:`from_dir`. ``eos_token_ids`` holds every id that ends generation (the tokenizer's
    EOS plus generation_config.json's); ``all_special_ids`` holds the ids ``decode(skip_special_tokens=True)``
    drops (every added token marked special, including the named ones).
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        special_tokens: dict[str, str] | None = None,
        chat_template: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        fallback_bos_token_id: int | None = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        clean_up_tokenization_spaces: bool = False,
    ) -> None:
        self._backend = backend
        # name ("bos_token", ...) -> content; template variables and the named special tokens.
        self.special_tokens: dict[str, str] = dict(special_tokens or {})
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._ensure_special(self.special_tokens.values())

        self.bos_token: str | None = self.special_tokens.get("bos_token")
        self.eos_token: str | None = self.special_tokens.get("eos_token")
        tok_bos = backend.token_to_id(self.bos_token) if self.bos_token else None
        tok_eos = backend.token_to_id(self.eos_token) if self.eos_token else None
        self.bos_token_id: int | None = tok_bos if tok_bos is not None else fallback_bos_token_id
        self.eos_token_id: int | None = tok_eos
        self.eos_token_ids: set[int] = set(extra_eos_token_ids) | (
            {tok_eos} if tok_eos is not None else set()
        )
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.all_special_ids: set[int] = {
            i for i, t in backend.get_added_tokens_decoder().items() if t.special
        }

        # BOS/EOS the post-processor does not already add, but the config asks for (never added twice).
        frame = backend.encode("", add_special_tokens=True).ids  # the post-processor's special ids alone
        self._prepend_bos = add_bos_token and tok_bos is not None and frame[:1] != [tok_bos]
        self._append_eos = add_eos_token and tok_eos is not None and frame[-1:] != [tok_eos]
        # transformers skips the WordPiece-era space clean-up for BPE models.
        self._cleanup = clean_up_tokenization_spaces and type(backend.model).__name__ != "BPE"

    def _ensure_special(self, contents: Iterable[str]) -> None:
        # Named special tokens are added (as transformers does) when the vocabulary lacks them as special.
        special = {t.content for t in self._backend.get_added_tokens_decoder().values() if t.special}
        missing = [c for c in dict.fromkeys(contents) if c not in special]
        if missing:
            self._backend.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in missing])

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load tokenizer.json (required) and the optional tokenizer_config.json, chat_template.jinja,
        generation_config.json and config.json from a Hugging Face model directory."""
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"tokenizer.json not found in directory {root}")
        backend = BackendTokenizer.from_file(str(tokenizer_file))
        # as transformers: a tokenizer.json's own padding and truncation apply only when a call asks for them
        backend.no_padding()
        backend.no_truncation()
        tok_cfg = _read_json(root / "tokenizer_config.json")
        gen_cfg = _read_json(root / "generation_config.json")
        model_cfg = read_config(root, missing_ok=True)

        special: dict[str, str] = {}
        for key, value in tok_cfg.items():
            if key.endswith("_token") and (content := _token_content(value)) is not None:
                special[key] = content
        extra = tok_cfg.get("extra_special_tokens") or tok_cfg.get("additional_special_tokens") or []
        extra_contents = [c for c in map(_token_content, extra if isinstance(extra, list) else []) if c]

        # A separate chat_template.jinja (transformers 5 layout) wins over the config entry.
        template_file = root / "chat_template.jinja"
        if template_file.is_file():
            chat_template: str | None = template_file.read_text(encoding="utf-8")
        else:
            chat_template = _pick_chat_template(tok_cfg.get("chat_template"))
            if chat_template is None:
                chat_template = _pick_chat_template(
                    _read_json(root / "chat_template.json").get("chat_template")
                )

        eos_ids = id_list(gen_cfg.get("eos_token_id")) or id_list(model_cfg.get("eos_token_id"))
        bos_ids = id_list(gen_cfg.get("bos_token_id")) or id_list(model_cfg.get("bos_token_id"))
        tok = cls(
            backend,
            special_tokens=special,
            chat_template=chat_template,
            extra_eos_token_ids=eos_ids,
            fallback_bos_token_id=bos_ids[0] if bos_ids else None,
            add_bos_token=bool(tok_cfg.get("add_bos_token", False)),
            add_eos_token=bool(tok_cfg.get("add_eos_token", False)),
            clean_up_tokenization_spaces=bool(tok_cfg.get("clean_up_tokenization_spaces", False)),
        )
        if extra_contents:
            tok._ensure_special(extra_contents)
            tok.vocab_size = backend.get_vocab_size(with_added_tokens=True)
            tok.all_special_ids = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        return tok

    # ---- ids <-> text ----

    def _with_specials(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens and self._prepend_bos:
            assert self.bos_token_id is not None
            ids = [self.bos_token_id, *ids]
        if add_special_tokens and self._append_eos:
            assert self.eos_token_id is not None
            ids = [*ids, self.eos_token_id]
        return ids

    def encode(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the post-processor's BOS/EOS (or the config's).

        A chat prompt already rendered with its BOS should be encoded with ``add_special_tokens=False``.
        ``split_special_tokens`` (transformers' name): a special token's text in ``text`` is encoded as the
        characters it is, not as the token (user text cannot forge a control token).
        """
        backend = self._literal_backend if split_special_tokens else self._backend
        ids = backend.encode(text, add_special_tokens=add_special_tokens).ids
        return self._with_specials(ids, add_special_tokens)

    @functools.cached_property
    def _literal_backend(self) -> BackendTokenizer:
        """A copy of the backend that matches no special token in text (built at first use, after any
        tokens were added)."""
        literal = BackendTokenizer.from_str(self._backend.to_str())
        literal.encode_special_tokens = True
        return literal

    def batch_encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """encode() for many texts at once (parallel in the Rust backend)."""
        encodings = self._backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [self._with_specials(e.ids, add_special_tokens) for e in encodings]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; invalid or incomplete UTF-8 byte sequences decode to U+FFFD."""
        text: str = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if self._cleanup:
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'")):
                text = text.replace(before, after)
            for suffix in ("n't", "'m", "'s", "'ve", "'re"):
                text = text.replace(" " + suffix, suffix)
        return text

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id`` (byte-level form), or None when out of range."""
        token: str | None = self._backend.id_to_token(token_id)
        return token

    @property
    def backend(self) -> BackendTokenizer:
        """The ``tokenizers`` object (encoders' truncation and pairs: tokenizer/encoder_inputs.py)."""
        return self._backend

    def backend_json(self) -> str:
        """The tokenizer as tokenizer.json text, added tokens included (what grammar engines read)."""
        return str(self._backend.to_str())

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary string, or None when it is not in the vocabulary."""
        token_id: int | None = self._backend.token_to_id(token)
        return token_id

    # ---- chat ----

    @staticmethod
    def validate_messages(messages: Any) -> None:
        """Raise ValueError unless ``messages`` is a well-formed, non-empty chat (see module function)."""
        validate_messages(messages)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """Render a chat with the model's template (same text as transformers' ``tokenize=False``).

        ``continue_final_message``: the text ends with the last message's content, open for the model to
        continue (the template's end-of-turn after it cut, as transformers does). Extra keyword arguments
        (e.g. ``tools``, ``enable_thinking``) become template variables. Raises ValueError for malformed
        messages or when the model has no chat template.
        """
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt (completions) instead")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        chat = normalize_messages(messages)
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        variables: dict[str, Any] = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        text = self._template.render(messages=chat, add_generation_prompt=add_generation_prompt, **variables)
        return _cut_after_final_message(text, chat[-1].get("content")) if continue_final_message else text

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """Token ids of a rendered chat (the template supplies any BOS, so none is added here)."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs), False)
