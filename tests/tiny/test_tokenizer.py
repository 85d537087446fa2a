"""The offline CLIP tokenizer: real file layout, loads with CLIPTokenizer, tokenizes anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import CLIPTokenizer

from onetrainer.tiny import build_clip_tokenizer, write_clip_tokenizer_files
from onetrainer.tiny.tokenizer import OPEN_CLIP_PAD_TOKEN, bytes_to_unicode, clip_vocab_and_merges


@pytest.fixture(scope="module")
def tokenizer() -> CLIPTokenizer:
    return build_clip_tokenizer()


def test_files_have_the_clip_layout(tmp_path: Path) -> None:
    write_clip_tokenizer_files(tmp_path)
    vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    merges = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    by_id = sorted(vocab, key=vocab.get)
    symbols = list(bytes_to_unicode().values())
    assert len(set(symbols)) == 256
    assert by_id[:256] == symbols
    assert by_id[256:512] == [s + "</w>" for s in symbols]
    assert by_id[-2:] == ["<|startoftext|>", "<|endoftext|>"]
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert merges[0].startswith("#version")
    assert len(merges) > 100
    for line in merges[1:]:
        a, b = line.split(" ")
        assert a + b in vocab
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 77
    assert config["pad_token"] == "<|endoftext|>"


def test_loads_with_from_pretrained(tmp_path: Path, tokenizer: CLIPTokenizer) -> None:
    write_clip_tokenizer_files(tmp_path)
    loaded = CLIPTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "A photo of a cat, masterpiece"
    assert loaded(text).input_ids == tokenizer(text).input_ids
    assert len(loaded) == len(tokenizer) == len(clip_vocab_and_merges()[0])


def test_round_trips_text(tokenizer: CLIPTokenizer) -> None:
    for text in ["a photo of a cat", "portrait of a woman with red hair, highly detailed", "xqzj 12345 #$%&"]:
        ids = tokenizer(text).input_ids
        assert ids[0] == tokenizer.bos_token_id
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True).replace(" ", "") == text.replace(" ", "")


def test_common_words_are_single_tokens(tokenizer: CLIPTokenizer) -> None:
    assert tokenizer.tokenize("a red circle on a blue background") == [
        "a</w>",
        "red</w>",
        "circle</w>",
        "on</w>",
        "a</w>",
        "blue</w>",
        "background</w>",
    ]


def test_any_text_tokenizes_without_unknown_tokens(tokenizer: CLIPTokenizer) -> None:
    text = "<embedding> ünïcödé 日本語 😀 \t tabs\nand newlines <|endoftext|> inside"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    # The unknown token is the end token; it may appear only where the text spells it out.
    assert ids.count(tokenizer.unk_token_id) == 1
    decoded = tokenizer.decode(ids)
    assert "日本語" in decoded
    assert "😀" in decoded


def test_placeholder_tokens_can_be_added(tokenizer: CLIPTokenizer) -> None:
    tok = build_clip_tokenizer()
    added = tok.add_tokens(["<embedding_0>", "<embedding_1>"])
    assert added == 2
    ids = tok("a photo of <embedding_0><embedding_1>", add_special_tokens=False).input_ids
    assert ids[-2:] == [len(tokenizer), len(tokenizer) + 1]


def test_padding_and_truncation() -> None:
    clip = build_clip_tokenizer()
    open_clip = build_clip_tokenizer(pad_token=OPEN_CLIP_PAD_TOKEN)
    for tok, pad_id in ((clip, clip.eos_token_id), (open_clip, 0)):
        ids = tok("a cat", padding="max_length", max_length=tok.model_max_length, truncation=True).input_ids
        assert len(ids) == 77
        assert ids[3:] == [tok.eos_token_id] + [pad_id] * 73
        long = tok("cat " * 200, padding="max_length", max_length=77, truncation=True).input_ids
        assert len(long) == 77
        assert long[-1] == tok.eos_token_id
    assert open_clip.pad_token == "!"
    assert open_clip.convert_tokens_to_ids("!") == 0
