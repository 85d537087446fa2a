"""A small Mistral (Tekken) tokenizer built offline, in the real one's scheme, for FLUX.2 [dev]'s tiny Mistral Small 3.2
text encoder.

The real vocabulary (Mistral Small 3.x as transformers converts Tekken: `tokenizer.json`) is byte-level BPE: 1000
control tokens first (`<unk>`, `<s>`, `</s>`, `[INST]`, … `[IMG]` at 10, `<pad>` at 11, … `[SYSTEM_PROMPT]` at 17,
then `<SPECIAL_20>`… unused), then the 256 byte symbols and the merges (131,072 tokens in all). We keep that layout
with the first 20 control tokens at their real ids (the text encoder's config names `[IMG]` by its id, 10) and a few
hundred merges learned from the built-in prompt text and the FLUX.2 system message, so any string tokenizes (every
byte has a symbol) while the vocabulary stays tiny.

The chat template is Mistral Small 3.x's for text and image turns, compacted: the start token, then a system turn as
`[SYSTEM_PROMPT]…[/SYSTEM_PROMPT]`, a user turn as `[INST]…[/INST]` (a content list renders its texts as they are and
each image as `[IMG]`, which the processor expands), an assistant turn followed by the end token.
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
from onetrainer.families.flux2_info import DEV_SYSTEM_MESSAGE
from onetrainer.tiny.tokenizer import PROMPT_CORPUS, learn_bpe_merges

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase

# The real vocabulary's first control tokens, at their real ids (0-19); the real file continues with <SPECIAL_20>
# to <SPECIAL_999>, which nothing writes.
CONTROL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)

# The real tokenizer_config.json's settings (Mistral Small 3.x as FLUX.2 [dev]'s tokenizer/ holds it; the class is
# transformers' generic tokenizers-backed one, which reads tokenizer.json as it is).
MISTRAL_TOKENIZER = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 1000000000000000019884624838656,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "clean_up_tokenization_spaces": False,
}

NUM_MERGES = 400
# The prompts and FLUX.2 [dev]'s system message, which its pipeline puts before every prompt.
CORPUS = f"{PROMPT_CORPUS}\n{DEV_SYSTEM_MESSAGE}\n"

# Tekken's word splitting, as in the converted tokenizer.json: letter runs (a capitalised word as one), single
# digits, punctuation runs, line breaks, other whitespace.
PRETOKENIZE_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{{- '[SYSTEM_PROMPT]' }}"
    "{%- elif message.role == 'user' %}{{- '[INST]' }}{%- endif %}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'text' %}{{- part.text }}"
    "{%- elif part.type == 'image' or part.type == 'image_url' %}{{- '[IMG]' }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- if message.role == 'system' %}{{- '[/SYSTEM_PROMPT]' }}"
    "{%- elif message.role == 'user' %}{{- '[/INST]' }}"
    "{%- elif message.role == 'assistant' %}{{- eos_token }}{%- endif %}"
    "{%- endfor %}"
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
def mistral_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """The vocabulary (token -> id) and merge list in the real file's order: the control tokens, the byte symbols,
    one token per merge learned from the corpus as Tekken splits it into words."""
    words = Counter(tuple(piece) for piece, _ in _pre_tokenizer().pre_tokenize_str(CORPUS))
    merges = learn_bpe_merges(words, NUM_MERGES)
    vocab: dict[str, int] = {}
    for token in [*CONTROL_TOKENS, *bytes_to_unicode().values(), *(a + b for a, b in merges)]:
        vocab.setdefault(token, len(vocab))
    return vocab, tuple(merges)


def build_tokenizer_object() -> Tokenizer:
    """The `tokenizers` pipeline of the converted tokenizer.json (Tekken's word split, byte-level BPE) over the tiny
    vocabulary, the control tokens special."""
    from tokenizers import AddedToken, Tokenizer, decoders, processors
    from tokenizers.models import BPE

    vocab, merges = mistral_vocab_and_merges()
    tokenizer = Tokenizer(
        BPE(
            vocab=dict(vocab),
            merges=list(merges),
            dropout=None,
            unk_token="<unk>",
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    # The start token before a plain text (the chat template writes its own: it is tokenized without this).
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL_TOKENS])
    return tokenizer


def write_mistral_tokenizer_files(folder: str | os.PathLike) -> Path:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja, as a hub Mistral Small 3.x tokenizer folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    build_tokenizer_object().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(MISTRAL_TOKENIZER, indent=2) + "\n", encoding="utf-8")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return folder


def build_mistral_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer as `AutoTokenizer.from_pretrained` loads it from freshly written files."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="onetrainer-tiny-mistral-tokenizer-") as tmp:
        write_mistral_tokenizer_files(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    tokenizer.name_or_path = ""
    return tokenizer
