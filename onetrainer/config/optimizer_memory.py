"""How much optimizer state each optimizer keeps per trained parameter, without torch: the memory estimate
(`training/estimate.py`) counts it and the optimizer guide (`config/optimizer_guide.py`) shows it."""

from __future__ import annotations

from onetrainer.config.enums import Optimizer

# Optimizer state in bytes per trained parameter (fp32 states; 8-bit variants keep one byte per state). Adafactor keeps
# a factored second moment (a row and a column per matrix: next to nothing) and, only with beta1, an fp32 first moment.
# AdEMAMix keeps a third (slow) first moment; Tiger one momentum; CAME_8BIT an 8-bit first moment beside factored ones.
# Prodigy + schedule-free keeps z, a factored second moment and Prodigy's s and p0 on every 11th element (slice_p: 8/11
# bytes); PRODIGY_ADV two moments and those; ADAMW_ADV and ADOPT_ADV two moments (the default), LION_ADV and
# SIGNSGD_ADV one (as LION and SGD). The first key found in the optimizer's name counts.
_STATE_BYTES = {"PRODIGY_PLUS_SCHEDULE_FREE": 4.8, "PRODIGY_ADV": 8.8, "AdEMAMix_8BIT": 3.0, "CAME_8BIT": 1.0,
                "8BIT": 2.0, "AdEMAMix": 12.0, "TIGER": 4.0, "SGD": 4.0, "LION": 4.0, "PRODIGY": 16.0,
                "DADAPT": 12.0}  # fmt: skip


def optimizer_state_bytes(optimizer: Optimizer, beta1: float | None = None, block=None) -> float:
    """Optimizer state per trained parameter; `block` (the optimizer settings) refines Muon's."""
    if optimizer is Optimizer.ADAFACTOR:
        return 4.0 if beta1 else 0.0
    if optimizer in (Optimizer.MUON, Optimizer.MUON_ADV, Optimizer.ADAMUON_ADV):
        return _muon_state_bytes(optimizer, block)
    name = optimizer.value
    for key, value in _STATE_BYTES.items():
        if key in name:
            return value
    return 8.0  # Adam-like: two fp32 moments


# Muon keeps one momentum per matrix weight (the hidden layers: nearly all trained parameters); the auxiliary Adam's
# two moments cover the rest (norms, biases, first and last layers: a few percent, counted as this share).
_MUON_ADAM_SHARE = 0.05


def _muon_state_bytes(optimizer: Optimizer, block) -> float:
    def setting(name: str, default):
        value = getattr(block, name, None) if block is not None else None
        return default if value is None else value

    momentum = 4.0
    if optimizer is not Optimizer.MUON and setting("nnmf_factor", False):
        momentum = 0.25  # factored: a row, a column and one sign bit per element
    if optimizer is Optimizer.ADAMUON_ADV and not setting("normuon_variant", True):
        momentum *= 2  # and a second moment per element (NorMuon keeps one number per neuron instead)
    if optimizer is not Optimizer.MUON and setting("approx_mars", False):
        momentum += 4.0  # MARS-M keeps the last gradient
    return (1 - _MUON_ADAM_SHARE) * momentum + _MUON_ADAM_SHARE * 8.0
