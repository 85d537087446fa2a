"""What a run tells the user besides its progress through the phases: what the scan found that will not be trained as
it is, an embedding's placeholder that no caption or prompt names, the usual causes of a NaN loss, and the progress
of the steps with their rate and the time left."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from onetrainer.training.events import Progress

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.data.training_data import TrainingData
    from onetrainer.families.base import LoadedModel
    from onetrainer.methods.base import Method
    from onetrainer.training.checkpoint import TrainProgress

Say = Callable[[str], None]


def report_scan(data: TrainingData, config: TrainConfig, warn: Say, status: Say) -> None:
    """Say what the scan found that will not be trained as it is: nothing is left out silently."""
    from onetrainer.data.scan import CLIPS_NEED_VIDEO, reference_rule

    rule = reference_rule(config)
    for scan in data.scans:
        for problem in scan.problems:
            warn(f"concept '{scan.name}': {problem}")
        for path, reason in scan.unreadable:
            warn(f"{path}: skipped ({reason})")
        for path in scan.resized_masks:
            warn(f"{path}: the mask's size differs from its image; it is resized")
        for path, frames, wanted in scan.mismatched_mask_clips:
            warn(
                f"{path}: the mask clip has {frames} frames, its clip {wanted}; not used (the clip's mask picture, "
                "else none)"
            )
        for text in [*scan.caption_warnings, *scan.image_warnings]:
            warn(text)
        if scan.missing_captions:
            warn(f"concept '{scan.name}': {len(scan.missing_captions)} images have no caption file")
        if scan.clips_need_video:
            names = ", ".join(p.name for p in scan.clips_need_video[:10])
            more = "…" if len(scan.clips_need_video) > 10 else ""
            warn(
                f"concept '{scan.name}': {len(scan.clips_need_video)} clips skipped, {CLIPS_NEED_VIDEO} "
                f"({config.model_type.value} trains images): {names}{more}"
            )
        for path, length, wanted, done in scan.short_clips:
            warn(f"{path}: {length} frames at the target rate, fewer than the {wanted} per clip: {done}")
        if scan.missing_references:
            names = ", ".join(p.name for p in scan.missing_references[:10])
            more = "…" if len(scan.missing_references) > 10 else ""
            warn(
                f"concept '{scan.name}': {len(scan.missing_references)} images have no reference image "
                f"(<name>-reference.<ext>) and are skipped: {names}{more}"
            )
        if scan.too_many_references:
            many = scan.too_many_references
            names = ", ".join(f"{p.name} ({n})" for p, n in many[:10])
            more = "…" if len(many) > 10 else ""
            warn(
                f"concept '{scan.name}': {len(many)} images have more reference images than {config.model_type.value} "
                f"takes and are skipped: {names}{more}"
            )
        without = [e.path.name for e in scan.images if not e.references]
        if rule is not None and not rule.required and without and len(without) < len(scan.images):
            names = ", ".join(without[:10]) + ("…" if len(without) > 10 else "")
            status(
                f"concept '{scan.name}': {len(without)} images have no reference image and train {rule.label} as "
                f"text to image: {names}"
            )
        if scan.missing_masks and config.masked_training:
            status(f"concept '{scan.name}': {len(scan.missing_masks)} images have no mask (trained whole)")
    dropped = sorted({s.image for e in range(config.epochs) for s in data.plan(e).dropped})
    if dropped:
        names = ", ".join(str(data.images[i].path.name) for i in dropped[:10])
        warn(f"drop_incomplete_batches: {len(dropped)} images are left out of some epochs ({names}…)")


def check_placeholders(data: TrainingData, config: TrainConfig, method: Method, warn: Say) -> None:
    """An embedding whose placeholder appears in no caption or prompt learns nothing: say so before training."""
    captions = [c for entry in data.images for c in entry.captions]
    prompts = [s.prompt for s in (config.samples or [])]
    for placeholder, found in method.embeddings.mentioned_in(captions).items():
        if not found:
            warn(
                f"no caption contains the embedding placeholder {placeholder}: the embedding will not learn. "
                "Put it in the captions (or use the 'filename' / 'concept' prompt source with it)"
            )
    for placeholder, found in method.embeddings.mentioned_in(prompts).items():
        if prompts and not found:
            warn(f"no sample prompt contains {placeholder}: the samples will not show the embedding")


def nan_advice(config: TrainConfig, model: LoadedModel, step: int) -> str:
    """Why the loss of step `step` (0-based) may have become NaN or infinite, from the config's usual suspects."""
    hints = []
    dtypes = {config.part(p).weight_dtype.value for p in model.parts}
    if "FLOAT_16" in dtypes or config.train_dtype.value == "FLOAT_16":
        hints.append("FLOAT_16 weights or training (try BFLOAT_16 or FLOAT_32, and a FLOAT_32 VAE)")
    hints.append(f"a learning rate that is too high ({config.learning_rate:g})")
    if config.optimizer.optimizer.is_adaptive:
        hints.append(f"the adaptive optimizer {config.optimizer.optimizer.value} (set the learning rate to 1)")
    return (
        f"the loss became NaN or infinite at step {step + 1}; usual causes: "
        + "; ".join(hints)
        + ". The last backup is kept unchanged."
    )


def progress_event(
    p: TrainProgress, total_steps: int, epochs: int, steps_per_epoch: int, step_times: list[float]
) -> Progress:
    """The progress after a step, with the rate over the last steps (`step_times`) and the time left at that rate."""
    rate = len(step_times) / sum(step_times) if step_times and sum(step_times) > 0 else 0.0
    eta = (total_steps - p.global_step) / rate if rate > 0 else None
    return Progress(p.global_step, total_steps, p.epoch, epochs, p.epoch_step, steps_per_epoch, rate, eta)
