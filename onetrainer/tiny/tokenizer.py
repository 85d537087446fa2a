"""A small CLIP tokenizer built offline, in the same file layout and byte-level BPE scheme as the real one.

The real CLIP vocabulary is 256 byte symbols, the same 256 with an end-of-word marker "</w>", one entry per BPE
merge, then "<|startoftext|>" and "<|endoftext|>". We keep that layout but learn only a few hundred merges from a
short built-in text, so any string still tokenizes (every byte has a symbol) while the vocabulary stays tiny.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import CLIPTokenizer

from onetrainer.families.clip_tokenizer import END_OF_WORD, bytes_to_unicode
from onetrainer.tiny.reference import CLIP_TOKENIZER, OPEN_CLIP_TOKENIZER

BOS_TOKEN = CLIP_TOKENIZER["bos_token"]
EOS_TOKEN = CLIP_TOKENIZER["eos_token"]
# SD 1.x and SDXL's first tokenizer pad with the end token; OpenCLIP (SD 2.x, SDXL's second tokenizer) pads with "!".
CLIP_PAD_TOKEN = CLIP_TOKENIZER["pad_token"]
OPEN_CLIP_PAD_TOKEN = OPEN_CLIP_TOKENIZER["pad_token"]

NUM_MERGES = 400

# Words typical of prompts and of the app's demo, so common words become one or two tokens like in the real vocabulary.
PROMPT_CORPUS = """
a photo of a cat sitting on a table in the kitchen, a dog running in the park, portrait of a woman with red hair,
a man wearing a blue jacket, landscape with mountains and a lake at sunset, a red circle on a blue background,
a green square on a white background, a yellow triangle on a black background, an orange star, a purple shape,
highly detailed, high quality, best quality, masterpiece, sharp focus, digital painting, oil painting, watercolor,
illustration, concept art, trending, studio lighting, soft light, dramatic lighting, cinematic, photorealistic,
close up, full body, wide angle, beautiful, cute, small, large, old, young, city street at night with neon lights,
a house in the forest, flowers in a garden, a car on the road, the sky with clouds, snow, rain, water, fire, tree,
girl, boy, person, people, face, eyes, smile, standing, looking at the viewer, background, simple background,
the quick brown fox jumps over the lazy dog, and, with, from, into, under, above, left, right, top, bottom, style,
anime, cartoon, drawing, sketch, render, 3d, art by an artist, picture, image, scene, light, dark, bright, color,
"""


def _word_symbols(word: str, byte_chars: dict[int, str]) -> tuple[str, ...]:
    symbols = [byte_chars[b] for b in word.encode("utf-8")]
    symbols[-1] += END_OF_WORD
    return tuple(symbols)


def learn_merges(text: str = PROMPT_CORPUS, num_merges: int = NUM_MERGES) -> list[tuple[str, str]]:
    """Classic BPE training: repeatedly merge the most frequent adjacent symbol pair (ties broken by the pair itself,
    so the result is deterministic)."""
    byte_chars = bytes_to_unicode()
    words: Counter[tuple[str, ...]] = Counter(
        _word_symbols(w, byte_chars) for w in text.lower().replace(",", " ").split() if w
    )
    return learn_bpe_merges(words, num_merges)


def learn_bpe_merges(words: Counter[tuple[str, ...]], num_merges: int) -> list[tuple[str, str]]:
    """The merge loop of `learn_merges` on words already split into byte symbols (each with its count), whatever
    the tokenizer's word splitting: shared with the tiny Qwen tokenizer (`qwen_tokenizer.py`)."""
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, count in words.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for symbols, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


@lru_cache(maxsize=1)
def clip_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """The vocabulary (token -> id) and merge list, in the real CLIP files' order."""
    merges = learn_merges()
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + END_OF_WORD for s in symbols]
    for a, b in merges:
        tokens.append(a + b)
    tokens += [BOS_TOKEN, EOS_TOKEN]
    vocab: dict[str, int] = {}
    for token in tokens:
        # Two merges can spell the same token ("ab"+"c", "a"+"bc"); the vocabulary holds it once.
        vocab.setdefault(token, len(vocab))
    return vocab, tuple(merges)


def write_clip_tokenizer_files(folder: str | os.PathLike, pad_token: str = CLIP_PAD_TOKEN) -> Path:
    """Write vocab.json, merges.txt, tokenizer_config.json and special_tokens_map.json like a hub CLIP tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = clip_vocab_and_merges()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config = {**CLIP_TOKENIZER, "pad_token": pad_token}
    special = {k: v for k, v in config.items() if k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    return folder


def build_clip_tokenizer(pad_token: str = CLIP_PAD_TOKEN) -> CLIPTokenizer:
    """A CLIPTokenizer loaded from freshly written files (the same path a user's tokenizer folder takes).

    `pad_token` is CLIP_PAD_TOKEN for SD 1.x / SDXL's first encoder, OPEN_CLIP_PAD_TOKEN for SD 2.x / SDXL's second.
    """
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory(prefix="onetrainer-tiny-tokenizer-") as tmp:
        write_clip_tokenizer_files(tmp, pad_token=pad_token)
        tokenizer = CLIPTokenizer.from_pretrained(tmp)
    # The files are gone; nothing should try to copy them from here later.
    tokenizer.vocab_file = None
    tokenizer.name_or_path = ""
    return tokenizer
