"""The real CLIP tokenizer (49,408 tokens), derived offline from the bundled BPE vocabulary.

Single-file checkpoints carry no tokenizer; this gives SD 1.x / 2.x / SDXL the exact one their text encoders were
trained with, without contacting the hub.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

from onetrainer.families.reference_configs import CLIP_TOKENIZER
from onetrainer.util.fs import atomic_directory

END_OF_WORD = "</w>"


def bytes_to_unicode() -> dict[int, str]:
    """CLIP's (and GPT-2's) reversible byte -> printable character table, in its canonical order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    bytes_, chars = list(printable), list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            bytes_.append(b)
            chars.append(256 + shift)
            shift += 1
    return {b: chr(c) for b, c in zip(bytes_, chars)}


VOCAB_FILE = Path(__file__).resolve().parents[1] / "resources" / "clip" / "bpe_simple_vocab_16e6.txt.gz"
VOCAB_SIZE = 49408
# The BPE file lists more merges than CLIP uses: its vocabulary keeps the first 49152 - 256 - 2 of them.
_MERGE_COUNT = VOCAB_SIZE - 2 * 256 - 2


@lru_cache(maxsize=1)
def _merges() -> tuple[tuple[str, str], ...]:
    lines = gzip.decompress(VOCAB_FILE.read_bytes()).decode("utf-8").split("\n")
    return tuple(tuple(line.split()) for line in lines[1 : 1 + _MERGE_COUNT])  # type: ignore[misc]


def write_tokenizer_files(folder: Path, pad_token: str) -> Path:
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + END_OF_WORD for s in symbols] + ["".join(m) for m in _merges()]
    tokens += [CLIP_TOKENIZER["bos_token"], CLIP_TOKENIZER["eos_token"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _merges())
    (folder / "merges.txt").write_text(merges, encoding="utf-8")
    config = {**CLIP_TOKENIZER, "pad_token": pad_token}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


def tokenizer_dir(cache_root: Path, pad_token: str) -> Path:
    """A tokenizer folder for `CLIPTokenizer.from_pretrained`, written once into the cache."""
    name = "clip-tokenizer-open" if pad_token == "!" else "clip-tokenizer"
    target = cache_root / name
    if not (target / "merges.txt").is_file():
        with atomic_directory(target) as tmp:
            write_tokenizer_files(tmp, pad_token)
    return target


def load_clip_tokenizer(cache_root: Path, pad_token: str = CLIP_TOKENIZER["pad_token"]):
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(str(tokenizer_dir(cache_root, pad_token)))
