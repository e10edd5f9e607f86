"""Train a byte-level BPE tokenizer on local text and save it in Hugging Face's layout.

Used by the demo-model trainer (tools/) and by the tests' tiny models; nothing here is fetched.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot|>"  # end of a chat turn
SPECIAL_TOKENS = [BOS, EOS, EOT, "<|user|>", "<|assistant|>", "<|system|>"]

# A small chat template in the Hugging Face style (jinja2); the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|eot|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# Text with multi-byte characters so that CJK and emoji get real merges and byte fallbacks.
MULTILINGUAL_TEXT = (
    "你好，世界！今天天气很好。我们一起去公园散步吧。机器学习和人工智能正在改变世界。\n"
    "こんにちは世界。日本語のテキストも少し入れておきます。東京は大きな都市です。\n"
    "안녕하세요 세계. 한국어 문장도 있습니다.\n"
    "Emoji: 😀 😃 😄 🚀 🌍 🎉 👍🏽 ❤️ 🇩🇪 👩‍💻 — naïve café déjà vu Ωμέγα Привет мир\n"
)


def stdlib_python_files(limit: int | None = None) -> list[Path]:
    """The CPython standard library's .py sources on this machine, in a stable order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    return files[:limit] if limit is not None else files


def iter_texts(files: list[Path], extra: str = MULTILINGUAL_TEXT) -> Iterator[str]:
    yield extra
    for path in files:
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue


def train_bpe(texts: Iterator[str] | list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) tokenizer with SPECIAL_TOKENS at the first ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_hf_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int = 2048) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template) to out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "add_bos_token": False,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def special_token_id(tok: Tokenizer, token: str) -> int:
    idx = tok.token_to_id(token)
    if idx is None:
        raise ValueError(f"special token {token!r} is not in the vocabulary")
    return idx
