"""A small Llama 3 tokenizer built offline, in the real one's scheme, for a tiny Llama-3.1 text encoder.

The real vocabulary (Llama 3.x's `tokenizer.json`, tiktoken's BPE as transformers converts it) is byte-level BPE: the
256 byte symbols and 127,744 merged tokens (ids 0-127,999), then 256 special tokens from id 128,000
(`<|begin_of_text|>`, `<|end_of_text|>`, reserved ones, the chat headers, `<|eot_id|>` at 128,009, …). We keep that
layout, the byte symbols and a few hundred merges learned from the built-in prompt text first, then the first eleven
special tokens in their real order, so any string tokenizes (every byte has a symbol) while the vocabulary stays tiny.
Like the real one it writes the start token before every text; it has no padding token (a pipeline that pads gives it
one, the end token).
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
from onetrainer.families.reference_configs import LLAMA3_TOKENIZER
from onetrainer.tiny.tokenizer import PROMPT_CORPUS, learn_bpe_merges

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

# The real special tokens' first eleven (ids 128000-128010 there), in their order; the file goes on with
# <|reserved_special_token_3|> to <|reserved_special_token_247|>, which nothing writes.
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)
NUM_MERGES = 400

# Llama 3's word splitting (tiktoken's cl100k-style pattern): contractions, letter runs with one leading non-letter,
# up to three digits, punctuation runs, line breaks, other whitespace.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )


@lru_cache(maxsize=1)
def llama_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """The vocabulary (token -> id) and merge list in the real file's order: the byte symbols, one token per merge
    learned from the prompt corpus as Llama 3 splits it into words, then the special tokens."""
    words = Counter(tuple(piece) for piece, _ in _pre_tokenizer().pre_tokenize_str(PROMPT_CORPUS))
    merges = learn_bpe_merges(words, NUM_MERGES)
    vocab: dict[str, int] = {}
    for token in [*bytes_to_unicode().values(), *(a + b for a, b in merges), *SPECIAL_TOKENS]:
        vocab.setdefault(token, len(vocab))
    return vocab, tuple(merges)


def build_tokenizer_object() -> Tokenizer:
    """The `tokenizers` pipeline of Llama 3's tokenizer.json (its word split, byte-level BPE, the start token before
    every text) over the tiny vocabulary, the special tokens special."""
    from tokenizers import AddedToken, Tokenizer, decoders, processors
    from tokenizers.models import BPE

    vocab, merges = llama_vocab_and_merges()
    tokenizer = Tokenizer(
        BPE(
            vocab=dict(vocab),
            merges=list(merges),
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=True,
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    start = SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{start} $A", pair=f"{start} $A {start} $B", special_tokens=[(start, vocab[start])]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


def write_llama_tokenizer_files(folder: str | os.PathLike) -> Path:
    """tokenizer.json and tokenizer_config.json, as a hub Llama 3.1 Instruct tokenizer folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer_object().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(LLAMA3_TOKENIZER, indent=2) + "\n", encoding="utf-8")
    return folder


def build_llama_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer as `AutoTokenizer.from_pretrained` loads it from freshly written files."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="onetrainer-tiny-llama-tokenizer-") as tmp:
        write_llama_tokenizer_files(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    tokenizer.name_or_path = ""
    return tokenizer
