"""Text-encoder passes several families share: T5's hidden states, CLIP's pooling at the end token."""

from __future__ import annotations

import torch

from onetrainer.families.base import TextEncoderSlot, first_weight


def t5_hidden_states(
    slot: TextEncoderSlot, captions: list[str], length: int, use_mask: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """T5's hidden states of the captions padded to `length` tokens (with the clip skip: an earlier layer through the
    final layer norm), and the tokens' mask; `use_mask`: T5 itself attends only to the tokens (Chroma), else to the
    padding too (Flux). T5 never runs under fp16 autocast (it overflows): in its own weight dtype."""
    tokens = slot.tokenizer(captions, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    encoder = slot.encoder
    device = first_weight(encoder).device
    mask = tokens.attention_mask.to(device)
    with torch.autocast(device.type, enabled=False):
        output = encoder(
            tokens.input_ids.to(device),
            attention_mask=mask if use_mask else None,
            output_hidden_states=slot.layer_skip > 0,
        )
        if slot.layer_skip > 0:
            hidden = encoder.encoder.final_layer_norm(output.hidden_states[-(slot.layer_skip + 1)])
        else:
            hidden = output.last_hidden_state
    return hidden, mask


def pool_at_end_token(encoder: torch.nn.Module, tokenizer) -> None:
    """Pool at the end token, not at the highest token id.

    Real CLIP configs carry the legacy `eos_token_id` 2, with which transformers pools at the highest id in the
    sequence: the end token for CLIP's own vocabulary, but an embedding's token once one is added. With the
    tokenizer's real end token both give the same result for plain prompts, and embeddings do not move the pooling.
    """
    eos = tokenizer.eos_token_id
    if eos is None or encoder.config.eos_token_id == eos:
        return
    encoder.config.eos_token_id = eos
    for module in encoder.modules():
        if "eos_token_id" in vars(module):
            module.eos_token_id = eos
            if hasattr(module, "config"):
                module.config.eos_token_id = eos
