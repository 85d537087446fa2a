"""The tiny Mistral (Tekken) tokenizer of `tiny:flux2-dev`: the real control tokens at their real ids, byte-level BPE
that tokenizes any text and decodes it back, and Mistral Small's chat format for FLUX.2 [dev]'s prompts."""

from __future__ import annotations

from onetrainer.families.flux2_info import DEV_SYSTEM_MESSAGE, MISTRAL3_SMALL_24B
from onetrainer.tiny.mistral_tokenizer import CONTROL_TOKENS, build_mistral_tokenizer


def test_the_control_tokens_keep_their_real_ids_and_any_text_round_trips():
    tokenizer = build_mistral_tokenizer()
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("<unk>", "<s>", "</s>", "[IMG]", "<pad>")}
    assert ids == {"<unk>": 0, "<s>": 1, "</s>": 2, "[IMG]": 10, "<pad>": 11}
    assert ids["[IMG]"] == MISTRAL3_SMALL_24B["image_token_index"]  # the config names it by its id
    assert len(tokenizer) < 1000 and tokenizer.pad_token == "<pad>" and tokenizer.bos_token == "<s>"
    for text in ("a photo of a cat", "Ünïcödé ✓ 42 — 東京", DEV_SYSTEM_MESSAGE):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert tokenizer.decode(ids) == text
        assert all(i >= len(CONTROL_TOKENS) for i in ids)  # text never becomes a control token
    # the learned merges make the prompts' words whole, as the real vocabulary does
    assert len(tokenizer("a photo of a cat", add_special_tokens=False).input_ids) == 5


def test_the_chat_template_renders_flux2_devs_prompt_as_mistral_small():
    tokenizer = build_mistral_tokenizer()
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a red circle"}]},
        {"role": "assistant", "content": "ok"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<s>[SYSTEM_PROMPT]be brief[/SYSTEM_PROMPT][INST][IMG]a red circle[/INST]ok</s>"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert ids[:2] == [1, 17] and ids.count(1) == 1  # one start token: the template's
