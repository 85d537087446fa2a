"""A T5 tokenizer folder holding only SentencePiece's `spiece.model` (PixArt's hub layout) loads offline.

Without the `sentencepiece` package transformers falls back to another reader and fails on these folders.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer, T5Tokenizer

from onetrainer.tiny.reference import T5_TOKENIZER
from tests.conftest import ROOT

CORPUS = [
    "a photo of a cat sitting on a red chair",
    "an oil painting of a lighthouse at dusk, stormy sea",
    "pixel art of a small green dragon",
    "portrait of a woman, soft light, film grain",
]


@pytest.fixture(scope="module")
def spiece_model() -> bytes:
    import sentencepiece

    out = io.BytesIO()
    # T5's special ids: pad 0, eos 1, unk 2, no bos.
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 10),
        model_writer=out,
        vocab_size=60,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        pad_piece=T5_TOKENIZER["pad_token"],
        eos_piece=T5_TOKENIZER["eos_token"],
        unk_piece=T5_TOKENIZER["unk_token"],
        minloglevel=2,
    )
    return out.getvalue()


@pytest.fixture
def spiece_folder(tmp_path: Path, spiece_model: bytes) -> Path:
    """The files of a hub T5 tokenizer folder: `spiece.model` plus its config, no `tokenizer.json`."""
    (tmp_path / "spiece.model").write_bytes(spiece_model)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(T5_TOKENIZER), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("loader", [T5Tokenizer, AutoTokenizer], ids=["T5Tokenizer", "AutoTokenizer"])
def test_a_sentencepiece_only_folder_loads_and_tokenizes_like_sentencepiece(
    loader, spiece_folder: Path, spiece_model: bytes
) -> None:
    import sentencepiece

    assert not (spiece_folder / "tokenizer.json").exists()
    tokenizer = loader.from_pretrained(spiece_folder, local_files_only=True)
    reference = sentencepiece.SentencePieceProcessor(model_proto=spiece_model)

    for prompt in ["a photo of a dragon at dusk", "pixel art, red lighthouse"]:
        # T5 appends </s> and nothing at the start.
        assert tokenizer(prompt).input_ids == [*reference.encode(prompt), reference.eos_id()]
    # The 100 sentinels follow the SentencePiece vocabulary, <extra_id_0> last.
    assert len(tokenizer) == reference.get_piece_size() + T5_TOKENIZER["extra_ids"]
    assert tokenizer.convert_ids_to_tokens(len(tokenizer) - 1) == "<extra_id_0>"
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1


def test_sentencepiece_is_a_declared_dependency() -> None:
    # (tomllib is 3.11+; we support 3.10)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dependencies = pyproject.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert re.search(r'^\s*"sentencepiece[>=<~ ]', dependencies, re.MULTILINE)
