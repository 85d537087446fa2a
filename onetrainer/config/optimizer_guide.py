"""Which optimizer suits which job: one line per optimizer, and the facts beside it (its state's memory per trained
parameter as the estimate counts it, whether it sets its own step size, whether it needs a learning-rate schedule,
whether it can step each weight inside the backward pass). `docs/config.md` shows the whole table, the README the
usual choices; both are generated from here and the optimizer table (`config/optimizers.py`), so they stay true.
"""

from __future__ import annotations

from dataclasses import dataclass

from onetrainer.config.enums import Optimizer

_ADAM_LIKE = "the Adam family's"
_ADV = (
    "adv-optm's: steps each weight in the backward pass (fused back pass) and rounds into BFLOAT_16 weights itself, "
    "with optional factored state; for full fine-tunes in bf16 on small cards"
)

# What each optimizer is good for, in a line.
SUITS: dict[Optimizer, str] = {
    Optimizer.ADAMW: "the default: a safe first choice for LoRAs and fine-tunes alike",
    Optimizer.ADAM: "AdamW without decoupled weight decay; OneTrainer's older presets",
    Optimizer.ADAMW_8BIT: "AdamW with 8-bit state: the usual choice when the optimizer state must be small",
    Optimizer.ADAM_8BIT: "Adam with 8-bit state",
    Optimizer.SGD: "plain (momentum) SGD: the least state; needs a well-tuned learning rate and schedule",
    Optimizer.SGD_8BIT: "SGD with an 8-bit momentum",
    Optimizer.ADAGRAD: "per-weight steps that shrink over the run; rarely used for diffusion models",
    Optimizer.ADAGRAD_8BIT: "Adagrad with 8-bit state",
    Optimizer.RMSPROP: "a running mean of squared gradients without momentum; rarely used for diffusion models",
    Optimizer.RMSPROP_8BIT: "RMSprop with 8-bit state",
    Optimizer.LAMB: "layer-wise adaptive steps for very large batches",
    Optimizer.LAMB_8BIT: "LAMB with 8-bit state",
    Optimizer.LARS: "layer-wise step scaling of SGD for very large batches",
    Optimizer.LARS_8BIT: "LARS with 8-bit state",
    Optimizer.LION: "sign updates with one momentum: half AdamW's state; use a 3–10x smaller learning rate",
    Optimizer.LION_8BIT: "Lion with an 8-bit momentum",
    Optimizer.PRODIGY: "sets its own step size (learning rate 1): LoRAs without tuning the learning rate",
    Optimizer.DADAPT_ADAM: "D-Adaptation's Adam: sets its own step size; Prodigy's predecessor",
    Optimizer.DADAPT_ADAN: "D-Adaptation's Adan: sets its own step size",
    Optimizer.DADAPT_ADA_GRAD: "D-Adaptation's Adagrad: sets its own step size",
    Optimizer.DADAPT_LION: "D-Adaptation's Lion: sets its own step size with Lion's small state",
    Optimizer.DADAPT_SGD: "D-Adaptation's SGD: sets its own step size",
    Optimizer.ADAFACTOR: "factored second moments (next to no state without beta1): full fine-tunes on small cards",
    Optimizer.CAME: "Adafactor's memory with steadier steps (confidence-guided)",
    Optimizer.CAME_8BIT: "CAME with an 8-bit first moment: the least state of the adaptive ones",
    Optimizer.SCHEDULE_FREE_ADAMW: "AdamW without a learning-rate schedule (samples and saves: its averaged weights)",
    Optimizer.SCHEDULE_FREE_SGD: "SGD without a learning-rate schedule",
    Optimizer.PRODIGY_PLUS_SCHEDULE_FREE: (
        "sets its own step size and needs no schedule, with factored state: OneTrainer's no-tuning choice for LoRAs "
        "and fine-tunes"
    ),
    Optimizer.ADAMW_ADV: f"AdamW, {_ADV}",
    Optimizer.ADOPT_ADV: f"ADOPT, {_ADV}",
    Optimizer.LION_ADV: f"Lion, {_ADV}",
    Optimizer.SIGNSGD_ADV: f"sign SGD with momentum, {_ADV}",
    Optimizer.PRODIGY_ADV: f"Prodigy (sets its own step size), {_ADV}",
    Optimizer.MUON: "orthogonalised momentum for the matrix weights, AdamW for the rest: full fine-tunes",
    Optimizer.MUON_ADV: f"Muon, {_ADV}",
    Optimizer.ADAMUON_ADV: f"Muon with Adam's second moment on the orthogonalised update, {_ADV}",
    Optimizer.ADABELIEF: f"{_ADAM_LIKE} steps scaled by how far the gradient strays from its mean: steadier than AdamW",
    Optimizer.TIGER: "Lion-like sign updates with one momentum (half AdamW's state)",
    Optimizer.AIDA: "AdaBelief with the gradient and its mean projected onto each other: narrower step sizes",
    Optimizer.YOGI: f"{_ADAM_LIKE} with an additive second moment that reacts less to noisy gradients",
    Optimizer.ADOPT: f"{_ADAM_LIKE} with the current gradient left out of its own normalisation: any beta2 converges",
    Optimizer.AdEMAMix: "AdamW plus a slow second average of the gradients: remembers further back; 1.5x AdamW's state",
    Optimizer.AdEMAMix_8BIT: "AdEMAMix with 8-bit state",
}


@dataclass(frozen=True)
class GuideRow:
    optimizer: Optimizer
    state_bytes: float  # per trained parameter, as the estimate counts it
    own_step_size: bool  # learning-rate-free: the learning rate should be about 1
    schedule_free: bool  # needs no learning-rate schedule
    fused_back_pass: bool  # can step each weight inside the backward pass
    package: str
    suits: str


def optimizer_guide_rows() -> list[GuideRow]:
    """A row for each optimizer that runs here, in the table's order."""
    from onetrainer.config.optimizer_memory import optimizer_state_bytes
    from onetrainer.config.optimizers import FUSABLE_OPTIMIZERS, OPTIMIZERS

    return [
        GuideRow(
            optimizer,
            optimizer_state_bytes(optimizer, row.defaults.get("beta1")),
            row.adaptive,
            row.schedule_free,
            optimizer in FUSABLE_OPTIMIZERS,
            row.package,
            SUITS[optimizer],
        )
        for optimizer, row in OPTIMIZERS.items()
    ]


def optimizer_guide_table(rows: list[GuideRow] | None = None) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| Optimizer | State per trained parameter | Learning rate | Schedule | Fused back pass | Package | Suits |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows if rows is not None else optimizer_guide_rows():
        state = f"{row.state_bytes:g} B"
        rate = "sets its own (use 1.0)" if row.own_step_size else "set it"
        schedule = "not needed" if row.schedule_free else "as configured"
        fused = "yes" if row.fused_back_pass else "no"
        lines.append(
            f"| `{row.optimizer.value}` | {state} | {rate} | {schedule} | {fused} | {row.package} | {row.suits} |"
        )
    return "\n".join(lines)
