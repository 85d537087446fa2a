"""OneTrainer's `attention_mechanism` as torch's scaled-dot-product attention kernels.

Every model here computes attention through `torch.nn.functional.scaled_dot_product_attention` (diffusers' processors
and transformers' SDPA path), which picks a kernel per call: on a CUDA GPU flash, memory-efficient, cuDNN or the
plain math one, on a CPU its own. SDP leaves that choice to torch, less cuDNN's kernel on a CUDA device
(`devices.select_device`: its backward failed at a large model's attention size). CUDNN and FLASH put cuDNN's fused
attention or FlashAttention-2 (torch's build of it: no extra package) first for the whole run, training steps and
samples alike; a call the preferred kernel cannot serve (a mask it does not take, a head size it lacks, a CPU) falls
back to flash, memory-efficient and math in that order (FLASH never to cuDNN's), so a preference never fails a
run. OneTrainer sets the same kernels through diffusers'
attention backends (`_native_cudnn`, and the flash-attn package for FLASH); the kernels are torch's either way.
FLEX (torch's flex attention) is not built: it needs the model's attention rewritten around it.
"""

from __future__ import annotations

import contextlib

from onetrainer.config.enums import AttentionMechanism

BUILT = (AttentionMechanism.SDP, AttentionMechanism.CUDNN, AttentionMechanism.FLASH)


def attention_kernels(mechanism: AttentionMechanism) -> contextlib.AbstractContextManager:
    """The kernels `mechanism` asks for, first in torch's order while the context is open (SDP: torch's own order)."""
    if mechanism is AttentionMechanism.SDP:
        return contextlib.nullcontext()
    if mechanism not in BUILT:
        raise ValueError(f"attention_mechanism: {mechanism.value} is not built here")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fallbacks = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    if mechanism is AttentionMechanism.CUDNN:
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION, *fallbacks], set_priority=True)
    return sdpa_kernel(fallbacks, set_priority=True)
