"""A small Qwen tokenizer built offline, in the real one's scheme and file layout (Qwen3's, as Z-Image ships it).

The real vocabulary is byte-level BPE: the 256 byte symbols, one token per merge (151,643 tokens in all), then added
tokens for the chat format and the vision placeholders. We keep that layout but learn only a few hundred merges from
the built-in prompt text, so any string still tokenizes (every byte has a symbol) while the vocabulary stays tiny.
The added tokens get the ids that follow the vocabulary, as in the real files; code must look them up by name
(`tokenizer.convert_tokens_to_ids("<|im_end|>")`), never use the hub's numbers.

The folder holds tokenizer.json, vocab.json + merges.txt and a tokenizer_config.json with the chat template inside,
like the hub's, and `AutoTokenizer.from_pretrained` loads it as transformers' Qwen2Tokenizer (the fast, `tokenizers`
backed one: transformers 5 has no other). The same builder can serve Qwen2.5-VL (Qwen-Image): the vision
placeholders are there.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.families.clip_tokenizer import bytes_to_unicode
from onetrainer.tiny.reference import QWEN3_TOKENIZER
from onetrainer.tiny.tokenizer import PROMPT_CORPUS, learn_bpe_merges

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

PAD_TOKEN = QWEN3_TOKENIZER["pad_token"]  # "<|endoftext|>"
EOS_TOKEN = QWEN3_TOKENIZER["eos_token"]  # "<|im_end|>"
IM_START = "<|im_start|>"
# Added tokens in the real vocabulary's order. The special ones are whole units the tokenizer never splits and
# `skip_special_tokens` drops; Qwen3's thinking tags are added but not special: the model writes them as text.
SPECIAL_TOKENS = (
    PAD_TOKEN,
    IM_START,
    EOS_TOKEN,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
THINK_TOKENS = ("<think>", "</think>")

NUM_MERGES = 400
# The prompts plus the chat format's role names, which the real vocabulary holds as single tokens too.
CORPUS = PROMPT_CORPUS + "\nsystem\nuser\nassistant\n"

# Qwen2's (and Qwen3's) word splitting, as in their tokenizer.json: contractions, letter runs with one leading
# non-letter, single digits, punctuation runs, line breaks, other whitespace.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen3's chat template for text conversations, compacted: system, user and assistant turns as
# "<|im_start|>{role}\n{content}<|im_end|>\n" (an assistant turn without its "<think>…</think>" reasoning, as Qwen3
# renders earlier turns), then the assistant's opening when asked. With `enable_thinking=False` that opening already
# holds an empty thinking block, the model's cue to answer directly; Z-Image's pipeline renders enable_thinking=True,
# which adds nothing. Tool calls are left out.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message.content if message.content is string else '' %}"
    "{%- if message.role == 'assistant' %}{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


@lru_cache(maxsize=1)
def qwen_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """The BPE vocabulary (token -> id; the added tokens follow it) and merge list, in the real files' order: byte
    symbols first, then one token per merge learned from the corpus as Qwen splits it into words."""
    words = Counter(tuple(piece) for piece, _ in _pre_tokenizer().pre_tokenize_str(CORPUS))
    merges = learn_bpe_merges(words, NUM_MERGES)
    vocab: dict[str, int] = {}
    for token in [*bytes_to_unicode().values(), *(a + b for a, b in merges)]:
        # Two merges can spell the same token ("ab"+"c", "a"+"bc"); the vocabulary holds it once.
        vocab.setdefault(token, len(vocab))
    return vocab, tuple(merges)


def build_tokenizer_object() -> Tokenizer:
    """The `tokenizers` pipeline of the real tokenizer.json (NFC, Qwen's word split, byte-level BPE without an
    unknown token) over the tiny vocabulary, with the added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    vocab, merges = qwen_vocab_and_merges()
    tokenizer = Tokenizer(
        BPE(
            vocab=dict(vocab),
            merges=list(merges),
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tokenizer


def tokenizer_config() -> dict:
    """tokenizer_config.json: the real settings, the added tokens by id and the chat template."""
    tokenizer = build_tokenizer_object()
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
        for token in (*SPECIAL_TOKENS, *THINK_TOKENS)
    }
    return {
        **QWEN3_TOKENIZER,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != PAD_TOKEN],
        "chat_template": CHAT_TEMPLATE,
    }


def write_qwen_tokenizer_files(folder: str | os.PathLike) -> Path:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_config.json like a hub Qwen3 tokenizer folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = qwen_vocab_and_merges()
    build_tokenizer_object().save(str(folder / "tokenizer.json"))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return folder


def build_qwen_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer as `AutoTokenizer.from_pretrained` loads it from freshly written files (the path a user's
    tokenizer folder takes)."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="onetrainer-tiny-qwen-tokenizer-") as tmp:
        write_qwen_tokenizer_files(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    # The files are gone; nothing should try to copy them from here later.
    tokenizer.name_or_path = ""
    return tokenizer
