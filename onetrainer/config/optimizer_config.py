"""The optimizer block (`optimizer`), with OneTrainer's parameter names.

A parameter left empty (null) takes the optimizer's own default from the optimizer table. Which parameters an
optimizer uses, with their defaults and tooltips, is declared in that table (`onetrainer.training.optim`); the GUI's
"..." dialog is generated from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onetrainer.config.enums import Optimizer
from onetrainer.config.optimizers import ROUNDING_OPTIMIZERS
from onetrainer.config.schema import ConfigNode, NotBuilt, setting

OFFERED_OPTIMIZERS = (
    Optimizer.ADAMW,
    Optimizer.ADAMW_8BIT,
    Optimizer.ADAM,
    Optimizer.ADAM_8BIT,
    Optimizer.SGD,
    Optimizer.SGD_8BIT,
    Optimizer.ADAGRAD,
    Optimizer.ADAGRAD_8BIT,
    Optimizer.RMSPROP,
    Optimizer.RMSPROP_8BIT,
    Optimizer.LAMB,
    Optimizer.LAMB_8BIT,
    Optimizer.LARS,
    Optimizer.LARS_8BIT,
    Optimizer.LION,
    Optimizer.LION_8BIT,
    Optimizer.PRODIGY,
    Optimizer.DADAPT_ADAM,
    Optimizer.DADAPT_ADAN,
    Optimizer.DADAPT_ADA_GRAD,
    Optimizer.DADAPT_LION,
    Optimizer.DADAPT_SGD,
    Optimizer.ADAFACTOR,
    Optimizer.CAME,
    Optimizer.CAME_8BIT,
    Optimizer.SCHEDULE_FREE_ADAMW,
    Optimizer.SCHEDULE_FREE_SGD,
    Optimizer.ADABELIEF,
    Optimizer.TIGER,
    Optimizer.AIDA,
    Optimizer.YOGI,
    Optimizer.ADOPT,
    Optimizer.AdEMAMix,
    Optimizer.AdEMAMix_8BIT,
    Optimizer.ADAMW_ADV,
    Optimizer.ADOPT_ADV,
    Optimizer.PRODIGY_ADV,
    Optimizer.SIGNSGD_ADV,
    Optimizer.LION_ADV,
    Optimizer.PRODIGY_PLUS_SCHEDULE_FREE,
    Optimizer.MUON,
    Optimizer.MUON_ADV,
    Optimizer.ADAMUON_ADV,
)


def _p(label: str, help: str, **meta):
    """An optimizer parameter: shown in the optimizer's "..." dialog, not as a form field."""
    return setting(None, label, help, ui=False, **meta)


def bfloat16_weights_train(config) -> bool:
    """A fine-tune that trains BFLOAT_16 weights in place (where stochastic rounding would matter)."""
    from onetrainer.config.enums import DataType, TrainingMethod
    from onetrainer.config.model_types import MODEL_TYPES

    if config.training_method is not TrainingMethod.FINE_TUNE:
        return False
    info = MODEL_TYPES.get(config.model_type)
    names = info.family.parts if info else ("unet", "prior", "transformer")  # a family to come: its denoiser
    return any(
        getattr(config.part(n), "train", False) and config.part(n).weight_dtype is DataType.BFLOAT_16 for n in names
    )


def _unused_knob(label: str, what: str):
    """A OneTrainer setting that OneTrainer passes to no optimizer: it loads with any value and changes nothing."""
    why = f"OneTrainer: {what}; OneTrainer passes it to no optimizer, so it changes nothing here either."
    return setting(None, label, why, ignored=True, is_inactive=lambda _value: True)


@dataclass
class TrainOptimizerConfig(ConfigNode):
    optimizer: Optimizer = setting(
        Optimizer.ADAMW,
        "Optimizer",
        "The algorithm that updates the weights. AdamW is the safe default; the 8-bit variants save memory; "
        "Prodigy and the DAdapt family find the learning rate themselves (set the learning rate to 1); Muon "
        "orthogonalises the hidden layers' updates and trains the rest with an auxiliary Adam.",
        tab="training",
        group="Optimizer",
        choices=OFFERED_OPTIMIZERS,
    )
    beta1: float | None = _p("Beta 1", "Decay of the running mean of the gradients (momentum).", minimum=0, maximum=1)
    beta2: float | None = _p("Beta 2", "Decay of the running mean of the squared gradients.", minimum=0, maximum=1)
    beta3: float | None = _p(
        "Beta 3",
        "Third decay rate (Prodigy's d estimate, CAME, DAdapt Adan, AdEMAMix's slow average; ADAMW_ADV and ADOPT_ADV: "
        "their AdEMAMix slow average).",
        minimum=0,
        maximum=1,
    )
    eps: float | None = _p("Epsilon", "A small number added to the denominator for numerical stability.", minimum=0)
    eps2: float | None = _p("Epsilon 2", "Adafactor's second epsilon (for the parameter scale).", minimum=0)
    weight_decay: float | None = _p(
        "Weight decay", "Shrinks the weights a little every step (regularisation).", minimum=0
    )
    momentum: float | None = _p("Momentum", "Momentum factor (SGD, RMSprop, LARS).", minimum=0)
    dampening: float | None = _p("Dampening", "Dampening of the momentum (SGD, LARS).", minimum=0)
    nesterov: bool | None = _p("Nesterov", "Use Nesterov momentum.")
    amsgrad: bool | None = _p(
        "AMSGrad", "Use the AMSGrad variant (keeps the maximum of the second moment; AdaBelief: of the variance)."
    )
    maximize: bool | None = _p("Maximize", "Maximise the objective instead of minimising it.")
    foreach: bool | None = _p("Foreach", "Use the multi-tensor implementation (faster, more memory).")
    fused: bool | None = _p("Fused", "Use the fused CUDA kernel where torch has one.")
    capturable: bool | None = _p("Capturable", "Allow CUDA graph capture.")
    differentiable: bool | None = _p("Differentiable", "Make the optimizer step differentiable (research use).")
    alpha: float | None = _p(
        "Alpha",
        "RMSprop: smoothing constant. AdEMAMix (and the *_ADV AdEMAMix): the weight of the slow average in the update.",
        minimum=0,
    )
    centered: bool | None = _p("Centered", "Normalise by the estimated variance of the gradient (RMSprop).")
    lr_decay: float | None = _p("LR decay", "Learning-rate decay (Adagrad).", minimum=0)
    initial_accumulator_value: float | None = _p("Initial accumulator", "Starting value of Adagrad's sums.", minimum=0)
    min_8bit_size: int | None = _p(
        "Min 8-bit size", "Tensors smaller than this keep 32-bit optimizer state.", minimum=0
    )
    percentile_clipping: int | None = _p(
        "Percentile clipping", "Clip gradients adaptively at this percentile of recent norms (100 = off).", minimum=1
    )
    block_wise: bool | None = _p("Block-wise", "Quantise the 8-bit state block by block (more precise).")
    is_paged: bool | None = _p("Paged", "Use paged optimizer state that can spill to CPU memory (CUDA only).")
    optim_bits: int | None = _p("Optimizer bits", "Bits of optimizer state: 32 or 8.", choices=(8, 32))
    max_unorm: float | None = _p("Max update norm", "Upper bound of the update norm (LAMB, LARS).", minimum=0)
    bias_correction: bool | None = _p("Bias correction", "Correct the bias of the running means (LAMB).")
    adam_w_mode: bool | None = _p("AdamW mode", "Decoupled weight decay (LAMB).")
    use_triton: bool | None = _p("Use Triton", "Use the Triton kernel (Lion, CUDA only).")
    d0: float | None = _p("Initial D", "The starting estimate of the step size D (Prodigy, DAdapt).", minimum=0)
    d_coef: float | None = _p("D coefficient", "Multiplies the estimated D: below 1 trains gentler.", minimum=0)
    growth_rate: float | None = _p("Growth rate", "Limits how fast D may grow per step (inf = unlimited).", minimum=0)
    log_every: int | None = _p("Log every", "Print DAdapt's internal state every N steps (0 = never).", minimum=0)
    decouple: bool | None = _p("Decouple", "Use AdamW-style decoupled weight decay.")
    use_bias_correction: bool | None = _p("Bias correction", "Use Adam's bias correction in the D estimate.")
    safeguard_warmup: bool | None = _p("Safeguard warmup", "Avoid a too large D during a learning-rate warmup.")
    fsdp_in_use: bool | None = _p("FSDP in use", "Set when training with fully sharded data parallelism.")
    slice_p: int | None = _p("Slice p", "Compute Prodigy's statistics on every p-th element to save memory.", minimum=1)
    clip_threshold: float | None = _p(
        "Clip threshold",
        "Adafactor: threshold of the update's RMS. LION_ADV: clip the update (0 = no clipping).",
        minimum=0,
    )
    decay_rate: float | None = _p("Decay rate", "Adafactor: exponent of the second-moment decay.")
    relative_step: bool | None = _p("Relative step", "Adafactor: compute the learning rate from the step count.")
    scale_parameter: bool | None = _p("Scale parameter", "Adafactor: scale the learning rate by the weights' RMS.")
    warmup_init: bool | None = _p("Warmup init", "Adafactor: warm the relative step up from 0.")
    stochastic_rounding: bool | None = _p(
        "Stochastic rounding",
        "Round each update into BFLOAT_16 weights up or down at random, with the probability of its distance to each "
        "value, so small updates add up instead of being lost (such weights step in float32, a few at a time). For "
        "optimizers that update each weight on its own (AdamW, Adam, SGD, Adagrad, RMSprop, Adafactor, CAME, Lion, "
        "Muon); adv-optm's *_ADV optimizers (MUON_ADV and ADAMUON_ADV too) and Prodigy + schedule-free round by "
        "themselves (on by default).",
        not_built=NotBuilt(
            "stochastic rounding with an optimizer that steps all weights together (Prodigy, D-Adaptation, "
            "schedule-free, 8-bit)",
            "updates round to the nearest BFLOAT_16 value: an update below half a weight's precision is lost, so a "
            "fine-tune at a small learning rate may barely change its BFLOAT_16 weights (FLOAT_32 weights keep every "
            "update, at twice the memory; or choose AdamW, Adafactor, CAME or Lion)",
            active=lambda value, config: (
                bool(value) and bfloat16_weights_train(config) and config.optimizer.optimizer not in ROUNDING_OPTIMIZERS
            ),
        ),
    )
    r: float | None = _p(
        "r",
        "Schedule-free: polynomial weighting power. Aida with AdaNorm: decay of the gradient-norm average.",
        minimum=0,
    )
    weight_lr_power: float | None = _p("Weight LR power", "Schedule-free: how the learning rate weights the average.")
    no_prox: bool | None = _p("No prox", "DAdapt Adan: how weight decay is applied.")
    decoupled_decay: bool | None = _p(
        "Decoupled decay", "Apply weight decay to the weights directly (AdamW style), not through the gradient."
    )
    fixed_decay: bool | None = _p(
        "Fixed decay", "Decay the weights by a fixed amount, not scaled by the learning rate."
    )
    rectify: bool | None = _p(
        "Rectify", "RAdam's rectification: no adaptive step while the variance estimate is still unreliable."
    )
    degenerated_to_sgd: bool | None = _p(
        "Degenerate to SGD", "With rectify, take SGD steps (not none) while the variance estimate is unreliable."
    )
    n_sma_threshold: int | None = _p(
        "SMA threshold", "With rectify, the length of the moving average from which adaptive steps start.", minimum=1
    )
    ams_bound: bool | None = _p("AMS bound", "Aida: keep the running maximum of the second moment (as AMSGrad).")
    k: int | None = _p("k", "Aida: how many times the moments are projected onto each other.", minimum=0)
    xi: float | None = _p("xi", "Aida: a small number that keeps the projections stable.", minimum=0)
    quant_block_size: int | None = _p(
        "Quant block size",
        "CAME 8-bit: elements per block of the 8-bit first moment (each block has its own scale).",
        minimum=1,
    )
    adanorm: bool | None = _p("AdaNorm", "Aida: scale the gradient by the running average of its norm (AdaNorm).")
    adam_debias: bool | None = _p(
        "Adam debias", "Aida, Yogi: leave the first moment's bias correction out of the step."
    )
    cautious: bool | None = _p(
        "Cautious", "ADOPT: skip the update's components whose sign disagrees with the gradient."
    )
    initial_accumulator: float | None = _p(
        "Initial accumulator", "Yogi: the starting value of the second moment.", minimum=0
    )

    # adv-optm (the *_ADV optimizers) and Prodigy + schedule-free.
    prodigy_steps: int | None = _p(
        "Prodigy steps",
        "Prodigy (ADV, + schedule-free): stop adapting the step size D after this many steps (0 = never stop).",
        minimum=0,
    )
    d_limiter: bool | None = _p(
        "D limiter", "Prodigy (ADV, + schedule-free): let the step size D grow by at most 2^0.25 per step."
    )
    nnmf_factor: bool | None = _p(
        "Factored state", "adv-optm: keep the moments as low-rank factors of each matrix (much less optimizer memory)."
    )
    cautious_wd: bool | None = _p(
        "Cautious weight decay", "adv-optm: decay only the weights whose sign agrees with the update's direction."
    )
    use_atan2: bool | None = _p(
        "atan2 update", "adv-optm: divide by the second moment through atan2 (no epsilon needed, bounded steps)."
    )
    orthogonal_gradient: bool | None = _p(
        "OrthoGrad", "adv-optm: keep only the part of each gradient orthogonal to its weight (against overfitting)."
    )
    kourkoutas_beta: bool | None = _p(
        "Kourkoutas-beta",
        "adv-optm: lower beta 2 per layer while its gradients spike (held at beta 2 during the LR warmup).",
    )
    auto_kappa_p: bool | None = _p(
        "Auto kappa p", "LION_ADV: choose the Lion-K exponent per weight from its shape (else plain sign steps)."
    )
    compile: bool | None = _p(
        "Compile optimizer", "adv-optm: compile each weight's update with torch.compile (faster steps, slow start)."
    )
    use_AdEMAMix: bool | None = _p(
        "AdEMAMix",
        "ADAMW_ADV, ADOPT_ADV, PRODIGY_ADV: add a slow moving average of the gradients (AdEMAMix), weighted by alpha. "
        "Its decay is beta3 for ADAMW_ADV and ADOPT_ADV, beta3_ema for PRODIGY_ADV (as OneTrainer passes them).",
    )
    Simplified_AdEMAMix: bool | None = _p(
        "Simplified AdEMAMix",
        "ADOPT_ADV, PRODIGY_ADV, SIGNSGD_ADV and the adv-optm Muons: accumulate the gradients instead of averaging "
        "them, the current gradient weighted by alpha_grad (use a high beta 1 and a lower learning rate).",
    )
    beta3_ema: float | None = _p(
        "Beta3 EMA", "PRODIGY_ADV with AdEMAMix: decay of the slow average.", minimum=0, maximum=1
    )
    alpha_grad: float | None = _p(
        "Alpha grad", "Simplified AdEMAMix: weight of the current gradient in the accumulated update.", minimum=0
    )
    use_speed: bool | None = _p(
        "SPEED", "Prodigy + schedule-free: estimate D from the momentum's progress (SPEED; experimental)."
    )
    use_cautious: bool | None = _p(
        "Cautious", "Prodigy + schedule-free: drop the update's components whose sign disagrees with the gradient."
    )
    use_grams: bool | None = _p(
        "Grams", "Prodigy + schedule-free: take the gradient's sign with the update's magnitude (Grams)."
    )
    use_adopt: bool | None = _p(
        "ADOPT", "Prodigy + schedule-free: update the second moment after the step (partial ADOPT)."
    )
    use_orthograd: bool | None = _p(
        "OrthoGrad", "Prodigy + schedule-free: keep only the part of each gradient orthogonal to its weight."
    )
    weight_decay_by_lr: bool | None = _p(
        "Weight decay by LR", "Prodigy + schedule-free: scale the weight decay by the learning rate (times D)."
    )
    split_groups: bool | None = _p(
        "Split groups", "Prodigy + schedule-free: estimate a step size D for each parameter group on its own."
    )
    split_groups_mean: bool | None = _p(
        "Split groups mean", "Prodigy + schedule-free: with split groups, use the harmonic mean of the groups' D."
    )
    factored: bool | None = _p(
        "Factored", "Prodigy + schedule-free: keep the second moment as row and column factors (less memory)."
    )
    factored_fp32: bool | None = _p(
        "Factored in FP32", "Prodigy + schedule-free: keep the factored second moment in float32."
    )
    use_stableadamw: bool | None = _p(
        "StableAdamW", "Prodigy + schedule-free: scale each update by its RMS, as Adafactor does."
    )
    use_schedulefree: bool | None = _p(
        "Schedule-free", "Prodigy + schedule-free: average the weights schedule-free (off: plain Prodigy steps)."
    )
    schedulefree_c: float | None = _p(
        "Schedule-free C",
        "Prodigy + schedule-free: weight of the latest step in the average (0 = the paper's).",
        minimum=0,
    )
    # OneTrainer parameters of optimizers this trainer does not offer: accepted, no effect.
    beta1_warmup: int | None = _unused_knob("beta1_warmup", "simplified AdEMAMix's steps of beta1 warmup")
    min_beta1: float | None = _unused_knob("min_beta1", "simplified AdEMAMix's beta1 at the warmup's start")
    # OneTrainer's memory engine: read and kept, not built yet (the run checks say what happens instead).
    fused_back_pass: bool | None = setting(
        False,
        "Fused back pass",
        "Update each weight as soon as its gradient is ready, during the backward pass, so the gradients of the whole "
        "model are never held at once (less VRAM for a fine-tune), and a fine-tune's offloaded layers can move with "
        "their optimizer state. Needs an optimizer that updates each weight on its own (AdamW, Adafactor, CAME, ...), "
        "and BFLOAT_16 or FLOAT_32 training; gradient clipping then clips each weight's gradient on its own.",
        ui=False,  # in the "..." dialog of the optimizers that can (`training/optim.dialog_parameters`)
    )

    # Muon (MUON, MUON_ADV, ADAMUON_ADV): the hidden layers' matrices step with Muon, the rest with an auxiliary Adam.
    MuonWithAuxAdam: bool | None = _p(
        "Muon with aux Adam",
        "Muon only for the hidden layers (the weights whose names match 'Hidden layers'), an auxiliary Adam for "
        "everything else: embeddings, norms, biases and the first and last layers. Off: every matrix steps with "
        "Muon. Either way, what Muon cannot orthogonalise (vectors such as biases and norms, embedding vectors; for "
        "MUON also convolution kernels, which torch's Muon does not take) steps with the auxiliary Adam.",
    )
    muon_hidden_layers: str | None = _p(
        "Hidden layers",
        "Comma-separated patterns of the weights Muon trains, matched against each trained weight's name: its part, "
        "then its path in the model (`unet.down_blocks.0.attentions.0.proj_in.weight`, a LoRA's "
        "`unet.down_blocks.0.attentions.0.proj_in.lora_A.default.weight`). A pattern matches where it appears in "
        "the name (or, with 'Use regex', where the regular expression finds a match). Empty: the model type's own "
        "patterns, OneTrainer's: the denoiser's blocks ('block', 'transformer_blocks', or 'layers' and 'refiner') and "
        "the text encoders' layers ('encoder.layers', which OneTrainer spells 'text_model.encoder.layers', or "
        "'encoder.block', or 'model.layers' for a language model; the Model types table of docs/config.md lists "
        "each).",
    )
    muon_adam_regex: bool | None = _p(
        "Use regex", "Read 'Hidden layers' as regular expressions (each searched in the weight's name)."
    )
    muon_adam_lr: float | None = _p(
        "Aux Adam LR",
        "Learning rate of the auxiliary Adam for the denoiser's (and other non-text-encoder parts') weights Muon does "
        "not train. Empty: the part's own learning rate. The learning-rate scaler and schedule apply to it too.",
        minimum=0,
    )
    muon_te1_adam_lr: float | None = _p(
        "Aux Adam LR TE1",
        "Learning rate of the auxiliary Adam for the first text encoder's weights Muon does not train. Empty: the "
        "text encoder's own learning rate.",
        minimum=0,
    )
    muon_te2_adam_lr: float | None = _p(
        "Aux Adam LR TE2",
        "Learning rate of the auxiliary Adam for the second text encoder's weights Muon does not train. Empty: the "
        "text encoder's own learning rate.",
        minimum=0,
    )
    muon_adam_config: dict[str, Any | None] | None = _p(
        "Aux Adam settings",
        'The auxiliary Adam\'s settings as a JSON object, e.g. {"beta1": 0.9, "beta2": 0.999}; a key left out '
        "takes its default. MUON (torch's AdamW): beta1, beta2, eps, weight_decay. MUON_ADV and ADAMUON_ADV "
        "(adv_optm's AdamW): beta1, beta2, eps, weight_decay, use_bias_correction, use_atan2, orthogonal_gradient, "
        "nnmf_factor, kourkoutas_beta, use_AdEMAMix, beta3_ema, alpha. Other optimizer settings in it (OneTrainer "
        "writes them all) are ignored.",
    )
    ns_steps: int | None = _p(
        "Newton-Schulz steps",
        "Muon: iterations that orthogonalise each update matrix (5 is enough; fewer are faster and rougher).",
        minimum=1,
    )
    rms_rescaling: bool | None = _p(
        "RMS rescaling",
        "MUON_ADV, ADAMUON_ADV: scale each orthogonalised update to the size of an Adam update, so Adam's learning "
        "rates (and schedules) carry over.",
    )
    normuon_variant: bool | None = _p(
        "NorMuon",
        "MUON_ADV, ADAMUON_ADV: normalise the orthogonalised update per output neuron by a running mean of its "
        "squares (NorMuon): more even updates, one number of state per neuron.",
    )
    beta2_normuon: float | None = _p(
        "NorMuon beta 2", "MUON_ADV: decay of NorMuon's per-neuron running mean of squares.", minimum=0, maximum=1
    )
    low_rank_ortho: bool | None = _p(
        "Low-rank orthogonalisation",
        "MUON_ADV, ADAMUON_ADV: orthogonalise a random low-rank projection of the update (faster on large matrices).",
    )
    ortho_rank: int | None = _p("Ortho rank", "The rank of the low-rank orthogonalisation.", minimum=1)
    accelerated_ns: bool | None = _p(
        "Accelerated Newton-Schulz",
        "MUON_ADV, ADAMUON_ADV: Chebyshev-accelerated Newton-Schulz (CANS), its coefficients fitted each step.",
    )
    approx_mars: bool | None = _p(
        "Approximate MARS",
        "MUON_ADV, ADAMUON_ADV: MARS-M variance reduction (corrects the gradient by its change since the last "
        "step; keeps the last gradient, one more copy of the weights).",
    )
