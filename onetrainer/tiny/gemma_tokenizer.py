"""A small Gemma tokenizer built offline, in the real one's scheme: byte-fallback BPE over "▁"-for-space text.

The real vocabulary (256,000 tokens) starts with `<pad>`, `<eos>`, `<bos>`, `<unk>`, `<mask>` (ids 0–4, the ids the
Gemma-2 configs name), holds a token for each of the 256 bytes (`<0x00>` … `<0xFF>`, what a character without a
token of its own falls back to) and one token per BPE merge. We keep that layout but learn only a few hundred merges
from the built-in prompt text and the text a family puts before every prompt (Sana's instruction), so any string
still tokenizes (every byte has a token) while the vocabulary stays tiny. The tokenizer is transformers'
`GemmaTokenizer` (the `tokenizers`-backed one: transformers 5 has no other), stored as tokenizer.json.
"""

from __future__ import annotations

import string
from collections import Counter
from typing import TYPE_CHECKING

from onetrainer.tiny.reference import GEMMA_TOKENIZER
from onetrainer.tiny.tokenizer import PROMPT_CORPUS, learn_bpe_merges

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SPACE = "▁"  # Gemma's normalizer writes every space as this symbol; there is no word splitting
SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")  # ids 0–4, as in the real vocabulary
NUM_MERGES = 400


def gemma_vocab_and_merges(corpus: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocabulary (token → id: the special tokens, the 256 byte tokens, the printable ASCII characters and
    "▁", then one token per merge) and the merges learned from `corpus`'s words, each with its leading space."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for character in SPACE + string.ascii_letters + string.digits + string.punctuation:
        vocab.setdefault(character, len(vocab))
    words = Counter(tuple(SPACE + word) for word in corpus.replace(",", " , ").split())
    merges = learn_bpe_merges(words, NUM_MERGES)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))  # two merges can spell one token
    return vocab, merges


def build_gemma_tokenizer(extra_text: str = "") -> PreTrainedTokenizerBase:
    """The tiny Gemma tokenizer, its merges learned from the prompt text and `extra_text` (text a family puts before
    every prompt, so that it takes a realistic number of tokens rather than one per character)."""
    from transformers import GemmaTokenizer

    vocab, merges = gemma_vocab_and_merges(PROMPT_CORPUS + "\n" + extra_text)
    config = {k: v for k, v in GEMMA_TOKENIZER.items() if k != "tokenizer_class"}
    return GemmaTokenizer(vocab=vocab, merges=merges, **config)
