"""A small T5 tokenizer built offline (Unigram model, "▁" word-start marker, 100 sentinel tokens, like T5's).

Real T5 folders ship a SentencePiece `spiece.model`, which transformers can read only with the `sentencepiece`
package; this one is stored as `tokenizer.json`, which needs nothing beyond `tokenizers`.
"""

from __future__ import annotations

import string
from collections import Counter
from typing import TYPE_CHECKING

from onetrainer.tiny.reference import T5_TOKENIZER
from onetrainer.tiny.tokenizer import PROMPT_CORPUS

if TYPE_CHECKING:
    from transformers import T5Tokenizer

WORD_START = "▁"
EXTRA_IDS = 100


def t5_vocab() -> list[tuple[str, float]]:
    """(piece, log-probability) pairs in id order: specials, pieces, then sentinels from <extra_id_99> down."""
    specials = [(T5_TOKENIZER["pad_token"], 0.0), (T5_TOKENIZER["eos_token"], 0.0), (T5_TOKENIZER["unk_token"], 0.0)]
    words = Counter(w for w in PROMPT_CORPUS.replace(",", " ").split() if w)
    # Whole words are cheap, single characters dear, so the Unigram model prefers the longest known pieces; any
    # printable ASCII text still tokenizes (other characters become <unk>, as with the real T5 vocabulary).
    pieces = [(WORD_START, -2.0)]
    pieces += [(WORD_START + w, -3.0 - i / 1000) for i, (w, _) in enumerate(sorted(words.items(), key=_by_count))]
    characters = string.ascii_letters + string.digits + string.punctuation
    pieces += [(WORD_START + c, -9.0) for c in characters if WORD_START + c not in dict(pieces)]
    pieces += [(c, -10.0) for c in characters]
    sentinels = [(f"<extra_id_{i}>", 0.0) for i in reversed(range(EXTRA_IDS))]
    return specials + pieces + sentinels


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def build_t5_tokenizer() -> T5Tokenizer:
    from transformers import T5Tokenizer

    return T5Tokenizer(
        vocab=t5_vocab(),
        extra_ids=EXTRA_IDS,
        model_max_length=T5_TOKENIZER["model_max_length"],
    )
