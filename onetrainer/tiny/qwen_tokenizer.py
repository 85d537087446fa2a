"""Small Qwen tokenizers built offline, in the real ones' scheme and file layout: Qwen3's (as Z-Image ships it) and
Qwen2.5-VL's (as Qwen-Image and Qwen-Image-Edit ship it).

The real vocabulary is byte-level BPE: the 256 byte symbols, one token per merge (151,643 tokens in all), then added
tokens for the chat format and the vision placeholders. We keep that layout but learn only a few hundred merges from
the built-in prompt text, so any string still tokenizes (every byte has a symbol) while the vocabulary stays tiny.
The added tokens get the ids that follow the vocabulary, as in the real files; code must look them up by name
(`tokenizer.convert_tokens_to_ids("<|im_end|>")`), never use the hub's numbers.

The folder holds tokenizer.json, vocab.json + merges.txt and a tokenizer_config.json with the chat template inside,
like the hub's, and `AutoTokenizer.from_pretrained` loads it as transformers' Qwen2Tokenizer (the fast, `tokenizers`
backed one: transformers 5 has no other).

The two tokenizers (`QwenFlavour`: QWEN3, QWEN25_VL) share the word splitting and the byte-level BPE; they differ in
their added tokens, their chat templates, and in what the merges are learned from. Qwen2.5-VL's also learns the
system prompts that diffusers' Qwen-Image pipelines put before every prompt: those pipelines drop a fixed number of
leading tokens (34, 64) from the text encoder's output, counted in the real vocabulary, where every word of the
system prompt is one token. Learned whole here too, the same count of tokens covers the same text.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.families.clip_tokenizer import bytes_to_unicode
from onetrainer.tiny.reference import QWEN3_TOKENIZER, QWEN25_VL_TOKENIZER, Config
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

# Qwen2.5-VL's added tokens in its vocabulary's order (ids 151643-151656 there), all special: the chat format, the
# grounding markers, and the vision placeholders that its processor expands (`<|image_pad|>`, `<|video_pad|>`) and
# its config names by id (`image_token_id`, `vision_start_token_id`, ...). The code tokens that follow them in the real
# file (`<tool_call>`, `<|fim_prefix|>`, ...; not special) are left out: nothing here writes them.
QWEN25_VL_SPECIAL_TOKENS = (
    PAD_TOKEN,
    IM_START,
    EOS_TOKEN,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# The system turns of diffusers' QwenImagePipeline and QwenImageEditPlusPipeline (their `prompt_template_encode`),
# which precede every prompt they encode.
QWEN_IMAGE_SYSTEM_PROMPT = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of the "
    "objects and background:"
)
QWEN_IMAGE_EDIT_SYSTEM_PROMPT = (
    "Describe the key features of the input image (color, shape, size, texture, objects, background), then explain "
    "how the user's text instruction should alter or modify the image. Generate a new image that meets the user's "
    "requirements while maintaining consistency with the original input where appropriate."
)
# Enough merges to learn every word of the corpus whole (about 510 do).
QWEN25_VL_NUM_MERGES = 1000
QWEN25_VL_CORPUS = f"{CORPUS}{QWEN_IMAGE_SYSTEM_PROMPT}\n{QWEN_IMAGE_EDIT_SYSTEM_PROMPT}\n"

# Qwen2.5-VL's chat template, compacted: a default system turn when the conversation has none, then each turn as
# "<|im_start|>{role}\n{content}<|im_end|>\n", where a content list renders its images and videos as vision
# placeholders (numbered "Picture 1: ", "Video 1: " with `add_vision_id`) and its texts as they are; then the
# assistant's opening when asked. With the Qwen-Image pipelines' system prompt and a user turn of images and text, it
# renders exactly the text those pipelines format themselves.
QWEN25_VL_CHAT_TEMPLATE = (
    "{%- set count = namespace(image=0, video=0) %}"
    "{%- for message in messages %}"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'image' or 'image' in part or 'image_url' in part %}"
    "{%- set count.image = count.image + 1 %}"
    "{%- if add_vision_id %}{{- 'Picture ' ~ count.image ~ ': ' }}{%- endif %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'video' or 'video' in part %}"
    "{%- set count.video = count.video + 1 %}"
    "{%- if add_vision_id %}{{- 'Video ' ~ count.video ~ ': ' }}{%- endif %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}{{- part.text }}"
    "{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# Qwen3-VL's chat template, compacted as Qwen2.5-VL's above (the same turns, vision placeholders and text parts) but
# without a default system turn: Qwen3-VL renders a conversation without one as it is (a pipeline prompting with one
# user message gets that turn alone).
QWEN3_VL_CHAT_TEMPLATE = QWEN25_VL_CHAT_TEMPLATE.replace(
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}",
    "",
)


# eq=False: a flavour is its own identity (and hashable, for the vocabulary cache).
@dataclass(frozen=True, eq=False)
class QwenFlavour:
    """What tells one tiny Qwen tokenizer from another: its added tokens (special ones, then plain ones, in the real
    vocabulary's order), chat template, the text its merges are learned from, and its tokenizer_config.json settings.
    """

    name: str
    special_tokens: tuple[str, ...]
    added_tokens: tuple[str, ...]
    chat_template: str
    corpus: str
    num_merges: int
    config: Config  # the real tokenizer_config.json's settings


QWEN3 = QwenFlavour("qwen3", SPECIAL_TOKENS, THINK_TOKENS, CHAT_TEMPLATE, CORPUS, NUM_MERGES, QWEN3_TOKENIZER)
QWEN25_VL = QwenFlavour(
    "qwen2.5-vl",
    QWEN25_VL_SPECIAL_TOKENS,
    (),
    QWEN25_VL_CHAT_TEMPLATE,
    QWEN25_VL_CORPUS,
    QWEN25_VL_NUM_MERGES,
    QWEN25_VL_TOKENIZER,
)
# Qwen3-VL's vocabulary holds Qwen2.5-VL's special tokens and, as plain added tokens, Qwen3's thinking tags.
QWEN3_VL = QwenFlavour(
    "qwen3-vl",
    QWEN25_VL_SPECIAL_TOKENS,
    THINK_TOKENS,
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN25_VL_CORPUS,
    QWEN25_VL_NUM_MERGES,
    QWEN25_VL_TOKENIZER,
)
FLAVOURS = (QWEN3, QWEN25_VL, QWEN3_VL)


def flavour_of(tokenizer: PreTrainedTokenizerBase) -> QwenFlavour:
    """The flavour a tiny tokenizer was built as, told by its chat template."""
    for flavour in FLAVOURS:
        if tokenizer.chat_template == flavour.chat_template:
            return flavour
    raise ValueError("not a tiny Qwen tokenizer: its chat template is none of the tiny ones")


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


@lru_cache(maxsize=len(FLAVOURS))
def qwen_vocab_and_merges(flavour: QwenFlavour = QWEN3) -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """The BPE vocabulary (token -> id; the added tokens follow it) and merge list, in the real files' order: byte
    symbols first, then one token per merge learned from the corpus as Qwen splits it into words."""
    words = Counter(tuple(piece) for piece, _ in _pre_tokenizer().pre_tokenize_str(flavour.corpus))
    merges = learn_bpe_merges(words, flavour.num_merges)
    vocab: dict[str, int] = {}
    for token in [*bytes_to_unicode().values(), *(a + b for a, b in merges)]:
        # Two merges can spell the same token ("ab"+"c", "a"+"bc"); the vocabulary holds it once.
        vocab.setdefault(token, len(vocab))
    return vocab, tuple(merges)


def build_tokenizer_object(flavour: QwenFlavour = QWEN3) -> Tokenizer:
    """The `tokenizers` pipeline of the real tokenizer.json (NFC, Qwen's word split, byte-level BPE without an
    unknown token) over the tiny vocabulary, with the added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    vocab, merges = qwen_vocab_and_merges(flavour)
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
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in flavour.special_tokens])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in flavour.added_tokens])
    return tokenizer


def tokenizer_config(flavour: QwenFlavour = QWEN3) -> dict:
    """tokenizer_config.json: the real settings, the added tokens by id and the chat template."""
    tokenizer = build_tokenizer_object(flavour)
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in flavour.special_tokens,
        }
        for token in (*flavour.special_tokens, *flavour.added_tokens)
    }
    return {
        **flavour.config,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in flavour.special_tokens if t != PAD_TOKEN],
        "chat_template": flavour.chat_template,
    }


def write_qwen_tokenizer_files(folder: str | os.PathLike, flavour: QwenFlavour = QWEN3) -> Path:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_config.json like a hub Qwen tokenizer folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = qwen_vocab_and_merges(flavour)
    build_tokenizer_object(flavour).save(str(folder / "tokenizer.json"))
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config = json.dumps(tokenizer_config(flavour), indent=2, ensure_ascii=False) + "\n"
    (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return folder


def build_qwen_tokenizer(flavour: QwenFlavour = QWEN3) -> PreTrainedTokenizerBase:
    """The tokenizer as `AutoTokenizer.from_pretrained` loads it from freshly written files (the path a user's
    tokenizer folder takes)."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="onetrainer-tiny-qwen-tokenizer-") as tmp:
        write_qwen_tokenizer_files(tmp, flavour)
        tokenizer = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
    # The files are gone; nothing should try to copy them from here later.
    tokenizer.name_or_path = ""
    return tokenizer


def rewrite_qwen_tokenizer(folder: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """Replace what `save_pretrained` wrote for `tokenizer` with the hub's layout.

    transformers 5 saves tokenizer.json and the chat template beside tokenizer_config.json (chat_template.jinja); hub
    Qwen folders hold vocab.json + merges.txt too and keep the template inside tokenizer_config.json."""
    import shutil

    shutil.rmtree(folder)
    write_qwen_tokenizer_files(folder, flavour_of(tokenizer))
