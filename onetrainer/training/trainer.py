"""The training loop. `Trainer.run()` reads top to bottom: set up, then epochs of steps, then the final save.

A step is one optimizer update (after gradient accumulation): intervals, totals, the LR schedule, TensorBoard's x-axis
and resume all count these. Every step draws its randomness from a generator seeded by the step number, so a run
resumed from a backup continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ConceptType, EMAMode, LossWeight
from onetrainer.config.timing import Interval
from onetrainer.data.cache import clear_cache, remove_outdated_entries
from onetrainer.data.caching import fill_latent_cache, fill_text_cache, text_encoders_frozen
from onetrainer.data.loader import RunBatches
from onetrainer.data.plan import hash_seed
from onetrainer.data.training_data import Batch, DatasetError, TrainingData
from onetrainer.families import load_family_class
from onetrainer.families.base import BatchInputs, Conditioning, PartRole
from onetrainer.families.sources import resolve_local
from onetrainer.methods import create_method
from onetrainer.noise.draws import perturb_noise, sample_noise
from onetrainer.noise.losses import mask_weights, per_pixel_loss, reduce_loss
from onetrainer.noise.weighting import timestep_weights
from onetrainer.precision.dtypes import fallback_dtype
from onetrainer.sampling.sampler import failure_reason, looks_broken, render, save_image
from onetrainer.training import stochastic_rounding
from onetrainer.training.checkpoint import (
    BackupDamaged,
    TrainProgress,
    backup_settings,
    differing_settings,
    list_backups,
    read_meta,
    restore_backup,
    run_identity,
    write_backup,
)
from onetrainer.training.control import TrainingControl
from onetrainer.training.devices import (
    autocast,
    grad_scaler,
    release_cached_memory,
    seed_step_generators,
    select_device,
)
from onetrainer.training.distributed import (
    SINGLE,
    Distributed,
    GlobalDraws,
    StoppedByRank,
    SyncedControl,
)
from onetrainer.training.ema import EMA
from onetrainer.training.events import (
    BestCheckpoint,
    Broadcast,
    CacheFilled,
    CacheProgress,
    Finished,
    Metrics,
    Progress,
    SampleReady,
    Scalars,
    Started,
    Status,
    Validated,
    Warning_,
)
from onetrainer.training.fused_back_pass import FusedBackPass
from onetrainer.training.interruptible import checked_in_every_layer
from onetrainer.training.optim import create_optimizer, effective_learning_rates, optimizer_spec
from onetrainer.training.placement import Placement, offloaded_parts
from onetrainer.training.processes import scaler_factor
from onetrainer.training.schedules import build_lr_scheduler, warmup_steps_of
from onetrainer.training.settings import StepSettings
from onetrainer.training.tensorboard import TensorBoardServer, TensorBoardSink
from onetrainer.training.validation import (
    LOSS_METADATA_KEY,
    STEP_METADATA_KEY,
    Checkpoint,
    ValidationRecord,
    ValidationResult,
    combine,
    progress_label,
    range_fractions,
)
from onetrainer.training.workspace import Workspace, safe_name
from onetrainer.util.disk import is_write_error, write_error_message
from onetrainer.util.fs import atomic_write_json, remove_leftovers
from onetrainer.util.part_dtypes import parts_meet_safely
from onetrainer.util.threads import MODEL_LIBRARY_LOCK

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    pass


class SaveFailed(RuntimeError):
    """The final model could not be written; the message says where the trained state is kept."""


class _StoppedEarly(Exception):
    """Stop was requested before the first step (while the model loads, the data is read or the cache fills)."""


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        control: TrainingControl,
        events: Broadcast,
        workspace: Workspace,
        dist: Distributed | None = None,
        as_given: dict | None = None,
    ) -> None:
        self.config = config
        # What the step's maths take from the config (noise, losses, gradient reduce), built once: they never read it.
        self.settings = StepSettings.from_config(config)
        # The config as the user gave it, for the workspace's record (the run's copy has a named-model source's names
        # replaced with the local folders it built).
        self.as_given = as_given
        self.control = control
        # Several processes (torchrun): commands come from the per-step sync, draws are sliced from the global batch,
        # outputs are rank 0's (see distributed.py).
        self.dist = dist
        self.is_main = dist is None or dist.is_main
        self.world_size = dist.world_size if dist is not None else 1
        self.draws = GlobalDraws(dist.rank, dist.world_size) if dist is not None else SINGLE
        if dist is not None:
            self.control = SyncedControl(control)
        self.events = events
        self.workspace = workspace
        self.progress = TrainProgress()
        self.tensorboard_server: TensorBoardServer | None = None
        self.resumed_from: Path | None = None
        self.last_backup: Path | None = None
        self._backup_step = -1  # the step of the last backup written by this run
        # The family's loss terms of the micro-batches of a step (tensor, loss scale), read once the step is queued.
        self._family_losses: dict[str, list[tuple[torch.Tensor, float]]] = {}
        self.family_losses: dict[str, float] = {}  # their means over the last step, by TensorBoard tag
        self._params_of: tuple[object, list[torch.Tensor]] | None = None  # (optimizer, its parameters) for clipping
        self.fused: FusedBackPass | None = None  # the fused back pass, when the optimizer settings ask for it
        self.validation_record: ValidationRecord | None = None  # rank 0's, with validation on
        self.last_validation: ValidationResult | None = None  # rank 0's
        self._validated_step = -1  # the step of the last validation (every rank)
        self._record_failed = False
        self.caching: CacheProgress | None = None  # the cache pass under way (None outside caching)
        self._caching_since = 0.0

    # =================================================================================================================
    def run(self) -> Finished:
        """The whole run; a stop before the first step ends it without writing anything."""
        try:
            with contextlib.ExitStack() as self._loaded:  # what the loaded model needs undone at the end
                return self._run()
        except (_StoppedEarly, StoppedByRank):
            if self.dist is not None:
                self.dist.leave()
            return self._nothing_trained("stopped" if self.caching is None else "stopped during caching")
        except Exception as e:
            if self.dist is not None:
                self.dist.leave(failure=f"{type(e).__name__}: {e}")
            raise

    def _nothing_trained(self, reason: str) -> Finished:
        # An untrained model (an all-zero LoRA) must never replace a trained one: nothing is written.
        destination = Path(self.config.output_model_destination).expanduser()
        kept = f" ({destination} is unchanged)" if destination.exists() else ""
        caching = self.caching
        if caching is not None:  # the entries written are whole files: the next run reads them instead of encoding
            done = f"{caching.done} of {caching.total} {caching.unit} were encoded ({caching.kind})"
            self.status(f"stopped during caching: {done} and stay in the cache for the next run")
        self.status(f"stopped before the first step: no step was trained, no model is written{kept}")
        return Finished(reason, "", 0)

    def _run(self) -> Finished:
        config = self.config
        if self.is_main:
            self._remove_leftovers()
            atomic_write_json(self.workspace.config_path, self.as_given or config.to_dict())
        self.device = self.dist.device if self.dist is not None else select_device(config.train_device, self.warn)

        self.status("loading the model")
        with MODEL_LIBRARY_LOCK:  # not beside the app's estimate worker importing the same libraries
            self.family = load_family_class(config.model_type)()
            self.model = self.family.load(config)
        # Parts in different dtypes (a bf16 denoiser, a float32 VAE) meet in caching, the loss, validation and samples.
        self._loaded.enter_context(parts_meet_safely(self.model.parts.values()))
        family = self.family
        self.placement = Placement(self.model.parts, family.part_roles, family.sampling_parts, self.device)
        offloaded = offloaded_parts(config, family)
        # Offloaded parts reach the device through their offloader once the method's adapters exist (never whole).
        self.placement.place(
            n for n, role in family.part_roles.items() if role is not PartRole.SAMPLING and n not in offloaded
        )
        self._stop_point()
        self.status("reading the training images")
        self.data = TrainingData(config, self.model.type_info.family.bucket_step, resolve_local)
        if self.dist is not None:
            self.data.shard(self.dist.rank, self.dist.world_size)
        self._report_scan()
        torch.manual_seed(hash_seed(self.data.seed, 0x5EED))  # adapters initialise the same way every run
        self.method = create_method(config, self.family, self.model, self.device)
        for notice in self.method.notices:
            self.warn(notice)
        for part, offload in offloaded.items():
            self.placement.offload_layers(part, offload(self.model.part(part)))
        if offloaded:  # now on the device as the others are, a window of blocks at a time (caching encodes with them)
            self.placement.place(n for n, role in family.part_roles.items() if role is not PartRole.SAMPLING)
        self._check_placeholders()
        self.with_masks = config.masked_training or self.model.type_info.inpainting
        self.text_cache = None
        self._stop_point()
        if config.latent_caching:
            self._fill_caches()
        # Frozen encoders whose outputs are cached leave the device (they come back to sample and validate).
        trained = self.method.trained_parts()
        self.placement.place(self.placement.per_step(trained, config.latent_caching, self.text_cache is not None))
        if config.only_cache:
            self.status("the cache is filled ('only cache' is on)")
            return Finished("cached")

        total_steps = self.data.total_steps()
        steps_per_epoch = self.data.steps_in_epoch(self.progress.epoch)
        self.method.enable_gradient_checkpointing()
        if config.compile:
            self._compile_denoiser()
        self.param_groups = self.method.param_groups()
        lr_scale = math.sqrt(scaler_factor(config.learning_rate_scaler.value, config, self.world_size))
        for group in self.param_groups:
            group["lr"] *= lr_scale
        warmup = warmup_steps_of(config.learning_rate_warmup_steps, total_steps)
        self.optimizer = create_optimizer(config.optimizer, self.param_groups, config.learning_rate, warmup)
        if stochastic_rounding.applies(config.optimizer):
            stochastic_rounding.install(self.optimizer)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, config, total_steps, steps_per_epoch)
        self.schedule_free = optimizer_spec(config.optimizer.optimizer).schedule_free
        self.ema = self._create_ema()
        self.grad_scaler = grad_scaler(self.device, config.train_dtype, self.param_groups)
        self.fused = FusedBackPass(self.optimizer, config.clip_grad_norm) if config.optimizer.fused_back_pass else None
        for offload in self.placement.offloads.values():
            if offload.trained:
                offload.carry_optimizer_state(self.optimizer)
        if config.continue_last_backup:
            self._resume()
        self._open_validation_record()
        self._stop_point()
        if self.progress.epoch >= config.epochs and self._output_behind_backup():
            self.status(f"all {config.epochs} epochs are trained; the model was never saved from this backup: saving")
            self._checkpoint_validation()
            output = self.save_final()
            return Finished("completed", str(output), self.progress.global_step)
        if self.progress.epoch >= config.epochs:
            message = f"all {config.epochs} epochs are already trained; raise 'epochs' to train further"
            self.status(message)
            return Finished("nothing to do", global_step=self.progress.global_step)

        self._start_tensorboard()
        self.events.emit(
            Started(
                self.workspace.run_name,
                total_steps,
                config.epochs,
                steps_per_epoch,
                str(self.workspace.log_path),
                str(self.workspace.root),
            )
        )
        best = self.validation_record.best() if self.validation_record is not None else None
        if best is not None:  # the best of the runs this one resumed
            self.events.emit(BestCheckpoint(best.path, best.label, best.loss))
        sample_every = Interval(config.sample_after, config.sample_after_unit, config.sample_skip_first)
        backup_every = Interval(config.backup_after, config.backup_after_unit)
        save_every = Interval(config.save_every, config.save_every_unit, config.save_skip_first)
        validate_every = Interval(config.validate_after, config.validate_after_unit)
        if not self.validating:
            validate_every = Interval(0, validate_every.unit)
        for interval in (sample_every, backup_every, save_every, validate_every):
            interval.start()
        self.method.update_freezing(self.progress.global_step, self.progress.epoch)
        self._set_train_mode()
        if self.schedule_free:
            self.optimizer.train()
        smooth_loss = None
        step_times: list[float] = []

        # One loader for the rest of the run: its workers start once and load ahead across epoch boundaries.
        run_batches = RunBatches(
            self.data,
            self.progress.epoch,
            self.progress.epoch_step,
            self.with_masks,
            self.text_cache is not None,
            config.dataloader_threads,
        )
        self._loaded.callback(run_batches.close)
        for epoch in range(self.progress.epoch, config.epochs):
            self.progress.epoch = epoch
            steps_per_epoch = self.data.steps_in_epoch(epoch)
            for batches in run_batches.epoch(epoch):
                if self.control.stop_requested:
                    break
                started = time.monotonic()
                loss = self.train_step(batches)
                self.progress.epoch_step += 1
                self.progress.global_step += 1
                step_times = [*step_times[-19:], time.monotonic() - started]

                n = self.progress.global_step
                smooth_loss = loss if smooth_loss is None else smooth_loss + (loss - smooth_loss) * max(0.01, 1 / n)
                extra = {"ema_decay": self.ema.current_decay()} if self.ema else {}
                extra.update(self.family_losses)
                self.events.emit(Metrics(n, loss, smooth_loss, effective_learning_rates(self.optimizer), extra))
                self._emit_progress(total_steps, steps_per_epoch, step_times)
                self._check_tensorboard()

                frozen = self.method.update_freezing(n, epoch)
                if frozen:
                    self.status(f"stopped training: {', '.join(frozen)}")
                # Validation first: a save or backup at the same step records its loss without measuring it again.
                if self._agreed(validate_every, validate_every.after_step(n)):
                    self.validate()
                if sample_every.after_step(n) or self.control.take("sample"):
                    self.sample()
                if self._agreed(backup_every, backup_every.after_step(n)) or self.control.take("backup"):
                    self.backup()
                if self._agreed(save_every, save_every.after_step(n)) or self.control.take("save"):
                    self.save_intermediate()
            if self.progress.epoch_step >= steps_per_epoch:
                self.progress.epoch, self.progress.epoch_step = epoch + 1, 0
                if validate_every.after_epoch(epoch + 1):
                    self.validate()
                if sample_every.after_epoch(epoch + 1):
                    self.sample()
                if backup_every.after_epoch(epoch + 1):
                    self.backup()
                if save_every.after_epoch(epoch + 1):
                    self.save_intermediate()
            if self.control.stop_requested:
                break
        run_batches.close()

        if self.progress.global_step > 0:
            self._checkpoint_validation()  # while the ranks still meet: the final backup and model record it
        if self.dist is not None:
            self.dist.left = True  # the ranks part here: rank 0 alone writes the backup and the model
        reason = "stopped" if self.control.stop_requested else "completed"
        if self.progress.global_step == 0:
            return self._nothing_trained(reason)
        if config.backup_before_save and self._backup_step != self.progress.global_step:
            self.backup()
        output = self.save_final()
        return Finished(reason, str(output), self.progress.global_step)

    # =================================================================================================================
    def train_step(self, batches: list[Batch]) -> float:
        """One optimizer step over `batches` (gradient accumulation); returns the mean loss of the micro-batches."""
        seed = hash_seed(self.data.seed, self.progress.global_step)
        seed_step_generators(seed, self.device)  # adapter dropout and anything else that uses the global generators
        generator = torch.Generator(device="cpu").manual_seed(seed)
        losses = []
        self._family_losses = {}
        fused = self.fused
        for index, batch in enumerate(batches):
            for problem in batch.problems:
                self.warn(problem)
            with autocast(self.device, self.config.train_dtype):
                loss = self.batch_loss(batch, generator)
                if len(batches) > 1:
                    loss = loss / len(batches)
            if loss.requires_grad:  # e.g. an embedding whose placeholder is in none of this batch's captions
                if fused is not None:
                    # The weights change during this backward pass: a non-finite loss must stop the run before it.
                    if not math.isfinite(loss.item()):
                        raise NonFiniteLoss(self._nan_advice())
                    fused.stepping = index == len(batches) - 1
                self.grad_scaler.scale(loss).backward()
            losses.append(loss.detach())
        # The losses are read once, after every backward pass has been queued: each read waits for the device, and a
        # wait between the forward and the backward pass would leave an accelerator idle while the backward launches.
        # A non-finite loss is still caught before the optimizer step, so the weights stay as they were.
        values = torch.stack(losses).cpu().tolist() if len(losses) > 1 else [losses[0].item()]
        if not all(math.isfinite(v) for v in values):
            raise NonFiniteLoss(self._nan_advice())
        total = 0.0
        for value in values:  # summed as Python floats, in order, as before (resume compares losses exactly)
            total += value
        self.family_losses = {
            f"loss/{k}": sum(float(t) * s for t, s in v) / len(batches) for k, v in self._family_losses.items()
        }
        if self.dist is not None:
            total = self._sync_step(total)
        params = self._optimizer_params()
        if fused is not None:
            fused.stepping = False  # every trained weight was updated as its gradient arrived
        elif any(p.grad is not None for p in params):
            self.grad_scaler.unscale_(self.optimizer)
            if self.config.clip_grad_norm is not None:
                # clip_grad_norm_ skips parameters without a gradient (frozen parts).
                torch.nn.utils.clip_grad_norm_(params, self.config.clip_grad_norm)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:  # no gradient this step (an embedding's placeholder in no caption): a grad scaler refuses to step
            self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.after_step(self.progress.global_step + 1)
        return total

    def _optimizer_params(self) -> list[torch.Tensor]:
        """Every parameter of the optimizer's groups, listed once: walking the groups each step costs ~0.4 ms."""
        if self._params_of is None or self._params_of[0] is not self.optimizer:
            self._params_of = (self.optimizer, [p for g in self.optimizer.param_groups for p in g["params"]])
        return self._params_of[1]

    def _sync_step(self, loss: float) -> float:
        """Every rank's status, the commands and the loss in one all-reduce, then the averaged gradients."""
        result = self.dist.sync(self.control.local, loss)
        self.control.update(result)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.dist.average_gradients(params, self.settings.reduce)
        return result.loss

    def _caption_drops(self, count: int, generator: torch.Generator) -> list[torch.Tensor | None]:
        """Caption dropout: one [count] bool mask per text encoder from its own `dropout_probability`, drawn
        independently in the encoders' order (None, and no draw, for an encoder without dropout: a one-encoder run
        draws as it always did)."""
        drops: list[torch.Tensor | None] = []
        for slot in self.model.text_encoders:
            probability = self.config.part(slot.part).dropout_probability
            if probability > 0:
                draw = torch.rand(self.draws.size(count), generator=generator)
                drops.append(self.draws.mine(draw) < probability)
            else:
                drops.append(None)
        return drops

    def _encode_captions(self, captions: list[str], batch: Batch, references: list | None = None) -> Conditioning:
        """The conditioning of captions: from the text cache when the encoders are frozen, else encoded now (with the
        batch's reference images, for a family that reads them with the caption)."""
        if self.text_cache is not None and batch.reference_keys is not None:

            def decoded_references() -> list:  # only for an entry missing from the cache
                return batch.references if batch.references is not None else self.data.load_references(batch.samples)

            return self.text_cache.conditioning(captions, self.device, batch.reference_keys, decoded_references)
        if self.text_cache is not None and references is None:
            return self.text_cache.conditioning(captions, self.device)
        if references is not None:
            return self.family.encode_text(self.model, captions, references=references)
        return self.family.encode_text(self.model, captions)

    def batch_loss(self, batch: Batch, generator: torch.Generator, timesteps: torch.Tensor | None = None):
        config, settings, family, model = self.config, self.settings, self.family, self.model
        latents = self._latents(batch)

        captions = [self.method.embeddings.apply(c) for c in batch.captions]
        references = None
        if batch.references is not None:
            references = [[r.to(self.device) for r in sample] for sample in batch.references]
        drops = self._caption_drops(len(captions), generator)
        if any(d is not None for d in drops):  # the family knows where each encoder's share of the conditioning is
            encode = lambda c: self._encode_captions(c, batch, references)  # noqa: E731
            conditioning = family.drop_captions(model, captions, drops, encode)
        else:
            conditioning = self._encode_captions(captions, batch, references)

        schedule = model.schedule
        # Drawn at the global batch's size and sliced (`distributed.GlobalDraws`; the whole batch in one process).
        draws = self.draws
        global_noise = sample_noise(draws.like(latents), generator, settings.draws)
        noise = draws.mine(global_noise).to(latents.device, latents.dtype)
        if timesteps is None:
            timesteps = draws.mine(
                schedule.sample_times(
                    draws.size(len(latents)), generator, settings.timesteps, self.device, latents.shape
                )
            )
        perturbed = draws.mine(perturb_noise(global_noise, generator, settings.draws)).to(latents.device)
        noisy = schedule.add_noise(latents, perturbed, timesteps)

        keep_unmasked = (
            draws.mine(torch.rand(draws.size(len(latents)), generator=generator)) < config.unmasked_probability
        )
        inputs = BatchInputs(
            latents=latents,
            pixels=self._pixels(batch),
            original_sizes=batch.original_sizes,
            crop_offsets=batch.crop_offsets,
            input_masks=self._input_masks(batch, keep_unmasked),
            keep_unmasked=keep_unmasked,
            cached={k: v.to(self.device) for k, v in batch.cached_extras.items()},
            references=references,
        )
        # Every copy to the device happens before the forward pass: a copy from (pageable) CPU memory waits for what the
        # device has queued, so one after the forward would hold the backward pass back until the forward has run.
        sample_weights = batch.loss_weights.to(self.device)
        weights = None
        if config.masked_training and batch.masks is not None:
            small = torch.nn.functional.interpolate(batch.masks, size=latents.shape[-2:], mode="area").to(self.device)
            weights = mask_weights(small, keep_unmasked.to(self.device), config.unmasked_weight)
        prior = [t is ConceptType.PRIOR_PREDICTION for t in batch.concept_types]
        prior_rows = torch.tensor(prior, device=self.device).view(-1, 1, 1, 1) if any(prior) else None
        extra = family.batch_extras(model, inputs)
        model_time = schedule.model_time(timesteps)
        predicted = family.predict(model, noisy, model_time, conditioning, extra)
        prediction = predicted.output.float()
        target = schedule.target(latents, noise, timesteps)
        if prior_rows is not None:
            # Prior-prediction concepts learn the base model's own prediction: the LoRA must not drift there.
            with torch.no_grad(), self.method.adapters_disabled():
                base = family.predict(model, noisy, model_time, conditioning, extra).output.float()
            target = torch.where(prior_rows, base, target.float())

        pixel_loss = per_pixel_loss(prediction, target.float(), settings.losses)
        per_sample = reduce_loss(pixel_loss, weights, config.normalize_masked_area_loss)
        if config.loss_weight_fn is not LossWeight.CONSTANT:  # a weight of 1: no operator for it every step
            per_sample = per_sample * timestep_weights(
                config.loss_weight_fn, config.loss_weight_strength, schedule, timesteps
            )
        scale = scaler_factor(config.loss_scaler.value, config, self.world_size)
        loss = (per_sample * sample_weights).mean()
        terms = dict(predicted.losses)
        if predicted.variance is not None and config.vb_loss_strength != 0:
            # Learned-variance channels train on the schedule's variational bound (the noise half detached there).
            bound = schedule.variational_bound(predicted.output, predicted.variance, latents, noisy, timesteps)
            terms["vb"] = bound * float(config.vb_loss_strength)
        for name, term in terms.items():
            # The family's own terms (already at their strength), with the same per-concept weights and scaler.
            term_loss = (term.float() * sample_weights).mean()
            self._family_losses.setdefault(name, []).append((term_loss.detach(), scale))  # read after backward
            loss = loss + term_loss
        return loss * scale if scale != 1 else loss

    def _latents(self, batch: Batch) -> torch.Tensor:
        if batch.latents is not None:
            return batch.latents.to(self.device).float()
        config = self.config
        with torch.no_grad(), autocast(self.device, fallback_dtype(config.train_dtype, config.fallback_train_dtype)):
            return self.family.encode_images(self.model, batch.pixels.to(self.device)).float().to(self.device)

    def _pixels(self, batch: Batch) -> torch.Tensor | None:
        return batch.pixels.to(self.device) if batch.pixels is not None else None

    def _input_masks(self, batch: Batch, keep_unmasked: torch.Tensor) -> torch.Tensor | None:
        """The inpainting input masks; a sample trained as if unmasked gets an all-white one (paint everything)."""
        if not self.model.type_info.inpainting or batch.masks is None:
            return None
        masks = batch.masks.clone()
        masks[keep_unmasked] = 1.0
        return masks.to(self.device)

    # =================================================================================================================
    @property
    def validating(self) -> bool:
        return self.config.validation and bool(self.data.validation_images)

    def validate(self) -> ValidationResult | None:
        """The loss of every validation image with its fixed noise at the fixed time of each range of the schedule
        (`validation.py`), with the weights that are saved (the EMA's when it is on) and no dropout. Each rank measures
        its share of the images; rank 0 reports, records and returns the result."""
        if self.is_main:
            self.status("validating")
        self._validated_step = self.progress.global_step
        fractions = range_fractions()
        rank, world = (self.dist.rank, self.dist.world_size) if self.dist is not None else (0, 1)
        measured: dict[int, tuple[str, list[float]]] = {}
        draws, self.draws = self.draws, SINGLE  # each image's batch whole, on the rank that measures it
        for module in self.model.parts.values():
            module.eval()
        with torch.no_grad(), self._inference_weights(), self.placement.for_encoding():
            for index, batch in self.data.validation_batches(self.with_masks, rank, world):
                batch = dataclasses.replace(batch, latents=self._latents(batch))  # encoded once for every range
                losses = []
                for fraction in fractions:
                    generator = torch.Generator(device="cpu").manual_seed(hash_seed(self.data.seed, index, 0xFA1))
                    times = self.model.schedule.validation_times(fraction.repeat(batch.size), self.device)
                    with autocast(self.device, self.config.train_dtype):
                        losses.append(float(self.batch_loss(batch, generator, times)))
                concept = self.config.concepts[self.data.validation_images[index].concept]
                measured[index] = (concept.name or concept.path, losses)
        self.draws = draws
        self._set_train_mode()
        if self.dist is not None:
            measured = {i: v for part in self.dist.all_gather_object(measured) for i, v in part.items()}
        if not self.is_main:
            return None
        if not measured:
            self.warn("no validation image could be read: nothing was validated")
            return None
        p = self.progress
        result = combine([measured[i] for i in sorted(measured)], p.global_step, p.epoch, p.epoch_step)
        self.last_validation = result
        self.events.emit(Scalars(p.global_step, result.scalars()))
        best = result
        if self.validation_record is not None:
            self.validation_record.add_validation(result)
            self._write_record()
            best = self.validation_record.best_validation() or result
        label = progress_label(result.epoch, result.epoch_step, result.step)
        best_label = progress_label(best.epoch, best.epoch_step, best.step)
        self.events.emit(Validated(p.global_step, label, result.loss, result.ranges, best.loss, best_label))
        return result

    def _agreed(self, interval: Interval, fired: bool) -> bool:
        """Whether a periodic action runs now, the same on every rank: validation makes backups and saves collective,
        and a wall-clock interval may fire on one rank and not another, so rank 0's clock decides."""
        if self.dist is None or not self.validating or not interval.unit.is_time:
            return fired
        return bool(self.dist.broadcast_object(fired))

    def _checkpoint_validation(self) -> ValidationResult | None:
        """The validation of the weights as they are now, for a checkpoint: the last one when it was at this step,
        else measured now (on every rank; once the ranks have parted, rank 0 records the last one)."""
        if not self.validating:
            return None
        parted = self.dist is not None and self.dist.left
        if self._validated_step != self.progress.global_step and not parted:
            self.validate()
        return self.last_validation

    def _open_validation_record(self) -> None:
        if not (self.is_main and self.validating):
            return
        record, problem = ValidationRecord.open(self.workspace.root, self.workspace.run_name, run_identity(self.config))
        if problem:
            self.warn(problem)
        if self.resumed_from is not None:
            record.resumed(self.progress.global_step)
        self.validation_record = record

    def _record_checkpoint(self, kind: str, path: Path, result: ValidationResult | None) -> None:
        """Note a written checkpoint and its validation loss in the record; say so when it is the run's new best."""
        record = self.validation_record
        if result is None or record is None:
            return
        p = self.progress
        checkpoint = Checkpoint(kind, str(path), p.global_step, p.epoch, p.epoch_step, result.loss, result.step)
        best = record.add_checkpoint(checkpoint)
        if best is not None:
            self.events.emit(BestCheckpoint(best.path, best.label, best.loss))
        self._write_record()

    def _write_record(self) -> None:
        try:
            self.validation_record.write()
        except OSError as e:
            if not self._record_failed:  # once: training goes on, the losses are still in TensorBoard and the log
                path = self.validation_record.path
                self.warn(f"the validation record is not kept: {write_error_message(e, path)}; training goes on")
            self._record_failed = True

    def _validation_metadata(self, result: ValidationResult | None) -> dict[str, str]:
        if result is None:
            return {}
        return {LOSS_METADATA_KEY: f"{result.loss:.6g}", STEP_METADATA_KEY: str(result.step)}

    # =================================================================================================================
    def sample(self) -> None:
        if not self.is_main or not any(s.enabled for s in (self.config.samples or [])):
            return
        self.status("sampling")
        with self._inference_weights(), self.placement.for_sampling():
            self._render_samples("")
        if self.ema is not None and self.config.non_ema_sampling:
            with self._inference_weights(use_ema=False), self.placement.for_sampling():
                self._render_samples(" - no-ema")
        self._set_train_mode()

    def _render_samples(self, suffix: str) -> None:
        p = self.progress
        ext = self.config.sample_image_format.extension
        for index, sample in enumerate(self.config.samples or []):
            if not sample.enabled:
                continue
            folder = self.workspace.dir("samples") / f"{index} - {safe_name(sample.prompt)}{suffix}"
            name = f"{self.workspace.run_name}-training-sample-{p.global_step}-{p.epoch}-{p.epoch_step}{ext}"
            try:
                image = render(
                    self.family,
                    self.model,
                    sample,
                    self.method.embeddings.apply,
                    self.device,
                    self.config.rescale_noise_scheduler_to_zero_terminal_snr,
                )
                path = save_image(image, folder / name, self.config.sample_image_format.value)
            except Exception as e:  # a preview is never worth the run
                log.exception("sample %d failed", index)  # the traceback goes to the run's log file
                self.warn(f"sample {index} ('{sample.prompt + suffix}') failed: {failure_reason(e)}; training goes on")
                release_cached_memory(self.device)
                continue
            broken = looks_broken(image)
            if broken:
                self.warn(f"{broken} ({path}): the usual fix is to {self.family.broken_sample_advice}")
            self.events.emit(SampleReady(p.global_step, index, sample.prompt + suffix, str(path)))

    @contextlib.contextmanager
    def _inference_weights(self, use_ema: bool = True) -> Iterator[None]:
        """The weights to sample and save with: the EMA's when it is on; schedule-free optimizers' evaluation point."""
        if self.schedule_free:
            self.optimizer.eval()
        try:
            with self.ema.swapped_in() if (self.ema is not None and use_ema) else contextlib.nullcontext():
                yield
        finally:
            if self.schedule_free:
                self.optimizer.train()

    def _compile_denoiser(self) -> None:
        """`compile`: the denoiser's blocks compiled one at a time (`memory/compile.py`), else a warning."""
        from onetrainer.memory.compile import compile_blocks, unavailable_reason

        part = self.family.denoiser_part
        paths = self.family.layer_blocks.get(part)
        if not paths:
            self.warn(f"compile: {self.family.info.label}'s {part} declares no blocks to compile; it trains uncompiled")
            return
        reason = unavailable_reason(self.device)
        if reason:
            self.warn(f"compile: {reason}; the {part} trains uncompiled")
            return
        count = compile_blocks(self.model.part(part), paths)
        self.status(f"the {part}'s {count} blocks compile on first use (the first steps are slower)")

    def backup(self) -> Path | None:
        """Write a backup; a failure (a full disk) is a warning and training goes on."""
        validation = self._checkpoint_validation()
        if not self.is_main:
            self._backup_step = self.progress.global_step
            return None
        self.status("writing a backup")
        keep = self.config.rolling_backup_count if self.config.rolling_backup else None
        extra = {"ema": self.ema.state_dict()} if self.ema is not None else None
        folder = self.workspace.dir("backup")
        loss = {"loss": validation.loss, "step": validation.step} if validation is not None else None
        try:
            with self.placement.whole():
                path = write_backup(
                    folder,
                    self.method,
                    self.optimizer,
                    self.lr_scheduler,
                    self.progress,
                    self.config,
                    extra,
                    keep,
                    loss,
                    self.config.keep_best,
                )
        except Exception as e:
            if not is_write_error(e):
                raise
            self.warn(f"the backup at step {self.progress.global_step} failed: {write_error_message(e, folder)}")
            return None
        self.last_backup, self._backup_step = path, self.progress.global_step
        self.status(f"backup written: {path}")
        self._record_checkpoint("backup", path, validation)
        return path

    def save_intermediate(self) -> None:
        validation = self._checkpoint_validation()
        if not self.is_main:
            return
        fmt = self.config.output_model_format
        suffix = "" if fmt.is_directory else ".safetensors"
        name = f"{self.config.save_filename_prefix}{self.workspace.run_name}-save-{self.progress.suffix()}{suffix}"
        path = self.workspace.dir("save") / name
        self.method.run_metadata = self._validation_metadata(validation)
        try:
            with self._inference_weights(), self.placement.whole():
                self.method.save_output(path)
        except Exception as e:
            if not is_write_error(e):
                raise
            self.warn(f"the intermediate save failed: {write_error_message(e, path)}; training goes on")
            return
        self.status(f"saved {name}")
        self._record_checkpoint("save", path, validation)

    def save_final(self) -> Path:
        """Write the model. When that fails, the trained state is kept in a backup and the message says how to save
        it (resume saves a model that is missing or older than the last backup)."""
        if not self.is_main:
            return Path(self.config.output_model_destination).expanduser()
        self.status("saving the model")
        destination = self._final_destination()
        validation = self.last_validation if self._validated_step == self.progress.global_step else None
        self.method.run_metadata = self._validation_metadata(validation)
        if self.ema is not None:
            self.ema.copy_to_params()  # the final model takes the averaged weights
        try:
            with self._inference_weights(use_ema=False), self.placement.whole():
                self.method.save_output(destination)
        except Exception as e:
            if not is_write_error(e):
                raise
            raise SaveFailed(self._save_failed_message(write_error_message(e, destination))) from e
        self.status(f"model saved: {destination}")
        self._record_checkpoint("final", destination, validation)
        return destination

    def _final_destination(self) -> Path:
        """The output path; with 'Prevent overwrites', a file that appeared during training (another run's) is kept
        and the model gets a name of its own beside it."""
        destination = Path(self.config.output_model_destination).expanduser()
        if not (self.config.prevent_overwrites and destination.exists()):
            return destination
        suffix = "" if self.config.output_model_format.is_directory else destination.suffix
        stem = destination.name[: len(destination.name) - len(suffix)] if suffix else destination.name
        alternative = destination.with_name(f"{stem}-{self.workspace.run_name}{suffix}")
        self.warn(
            f"{destination} appeared during training and 'Prevent overwrites' is on: it is kept, and this run's model "
            f"is saved as {alternative}"
        )
        return alternative

    def _save_failed_message(self, reason: str) -> str:
        if self._backup_step != self.progress.global_step:
            self.backup()  # the trained state must survive a failed save (a bad output path, a full disk)
        if self._backup_step == self.progress.global_step and self.last_backup is not None:
            return (
                f"the model could not be saved: {reason}. The trained state is in the backup {self.last_backup}: fix "
                "the output location (or free space) and run again with 'Continue from last backup' to save it"
            )
        return f"the model could not be saved, nor a backup written: {reason}"

    # =================================================================================================================
    def _resume(self) -> None:
        """Continue from the newest intact backup of this run's identity (other configs' backups are not looked at);
        a damaged one is named and the next older one is tried."""
        folder = self.workspace.dir("backup")
        backups = list_backups(folder, run_identity(self.config))
        if not backups:
            others = len(list_backups(folder))
            also = f" ({others} there are of other model types, methods, base models or concepts)" if others else ""
            self.warn(
                f"'Continue from last backup' is on but {folder} has no backup of this config{also}: starting fresh"
            )
            return
        for backup in reversed(backups):
            try:
                with self.placement.whole(written=True):
                    self.progress, state, warnings = restore_backup(
                        backup, self.method, self.optimizer, self.lr_scheduler
                    )
            except BackupDamaged as e:
                self.warn(f"backup {backup.name} is damaged and skipped: {e}")
                continue
            break
        else:
            self.warn(f"no intact backup of this config in {folder}: starting fresh")
            self.progress = TrainProgress()
            return
        if self.ema is not None and "ema" in state:
            self.ema.load_state_dict(state["ema"])
        for warning in warnings:
            self.warn(warning)
        self._warn_changed_settings(backup)
        self.resumed_from = self.last_backup = backup
        p = self.progress
        self._backup_step = p.global_step
        self.status(f"resumed from {backup.name}: epoch {p.epoch + 1}, step {p.global_step}")

    def _warn_changed_settings(self, backup: Path) -> None:
        changed = differing_settings(backup_settings(backup), self.config.to_dict())
        if not changed:
            return
        shown = "; ".join(f"{path}: {old!r} in the backup, {new!r} now" for path, old, new in changed[:8])
        more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
        self.warn(
            f"the config differs from the one {backup.name} was written with ({shown}{more}). The config's values "
            "are used (learning rates included); the backup brings the trained weights, the optimizer's state, the "
            "progress and the random state"
        )

    def _output_behind_backup(self) -> bool:
        """True when the resumed backup is complete but the output is missing or older: a run that trained to the
        end but whose final save never happened (killed, disk full, a bad output path)."""
        if self.resumed_from is None:
            return False
        destination = Path(self.config.output_model_destination).expanduser()
        if not destination.exists():
            return True
        written = read_meta(self.resumed_from).get("written_at", self.resumed_from.stat().st_mtime)
        return destination.stat().st_mtime < written

    def _remove_leftovers(self) -> None:
        """Temporary files and folders of writes that a kill interrupted (ours carry the writer's process id)."""
        destination = Path(self.config.output_model_destination).expanduser()
        folders = [self.workspace.dir(sub) for sub in ("backup", "save", "config")] + [destination.parent]
        removed = [p for folder in folders for p in remove_leftovers(folder)]
        for sub in ("latents", "text"):
            removed += remove_leftovers(Path(self.config.cache_dir).expanduser() / sub, recursive=True)
        for path in removed:
            self.status(f"removed {path}, left over from an interrupted write")

    def _stop_point(self, sync: bool = True) -> None:
        if self.dist is not None:
            if sync:  # a phase boundary every rank passes: a stop on any rank stops all of them here
                result = self.dist.sync(self.control.local)
                self.control.update(result)
                if result.stop and self.progress.global_step == 0:
                    self.dist.left = True  # every rank ends now, knowing it
                    raise _StoppedEarly
            elif self.control.local.stop_requested and self.progress.global_step == 0:
                raise _StoppedEarly  # said to the others by `leave` (run())
            return
        if self.control.stop_requested and self.progress.global_step == 0:
            raise _StoppedEarly

    def _report_scan(self) -> None:
        """Say what the scan found that will not be trained as it is: nothing is left out silently."""
        for scan in self.data.scans:
            for problem in scan.problems:
                self.warn(f"concept '{scan.name}': {problem}")
            for path, reason in scan.unreadable:
                self.warn(f"{path}: skipped ({reason})")
            for path in scan.resized_masks:
                self.warn(f"{path}: the mask's size differs from its image; it is resized")
            for text in [*scan.caption_warnings, *scan.image_warnings]:
                self.warn(text)
            if scan.missing_captions:
                self.warn(f"concept '{scan.name}': {len(scan.missing_captions)} images have no caption file")
            if scan.missing_references:
                names = ", ".join(p.name for p in scan.missing_references[:10])
                more = "…" if len(scan.missing_references) > 10 else ""
                self.warn(
                    f"concept '{scan.name}': {len(scan.missing_references)} images have no reference image "
                    f"(<name>-reference.<ext>) and are skipped: {names}{more}"
                )
            if scan.missing_masks and self.config.masked_training:
                self.status(f"concept '{scan.name}': {len(scan.missing_masks)} images have no mask (trained whole)")
        dropped = sorted({s.image for e in range(self.config.epochs) for s in self.data.plan(e).dropped})
        if dropped:
            names = ", ".join(str(self.data.images[i].path.name) for i in dropped[:10])
            self.warn(f"drop_incomplete_batches: {len(dropped)} images are left out of some epochs ({names}…)")

    def _fill_caches(self) -> None:
        config = self.config
        if config.clear_cache_before_training:
            clear_cache(config.cache_dir)
            self.status(f"cleared the cache in {config.cache_dir} ('Clear cache before training' is on)")
        outdated, size = remove_outdated_entries(config.cache_dir)
        if outdated:
            self.status(f"removed {outdated} cache entries of an earlier format ({size / 1024**2:.1f} MiB)")
        # A stop is noticed inside the encoders as well (before each layer), not only between the entries they write:
        # one batch of a large encoder can take minutes.
        with checked_in_every_layer(self.model.parts.values(), lambda: self._stop_point(sync=False)):
            self._fill_latent_and_text_caches()

    def _fill_latent_and_text_caches(self) -> None:
        config = self.config
        ranks = self.dist
        stats = fill_latent_cache(
            self.data, self.family, self.model, config, self.with_masks, self._caching_progress, ranks
        )
        self.caching = None
        for failure in stats.failed:
            self.warn(f"{failure}; skipped")
        if not self.data.images:
            raise DatasetError("no training image could be decoded")
        rate = f"{stats.per_second:.1f}/s"
        self.status(f"latents: {stats.needed - stats.encoded} cached, {stats.encoded} encoded ({rate})")
        self.events.emit(CacheFilled("latents", stats.needed, stats.encoded, stats.seconds))
        if text_encoders_frozen(config):
            self.text_cache, text_stats = fill_text_cache(
                self.data, self.family, self.model, config, self.method.embeddings.apply, self._caching_progress, ranks
            )
            self.caching = None
            self.status(f"captions: {text_stats.needed - text_stats.encoded} cached, {text_stats.encoded} encoded")
            self.events.emit(CacheFilled("captions", text_stats.needed, text_stats.encoded, text_stats.seconds))

    def _caching_progress(self, kind: str, done: int, total: int) -> None:
        """A cache pass's progress (the footer's bar, the terminal's), reported after each entry it writes: a stop ends
        caching there (or inside the encoders, `_fill_caches`), keeping every entry written so far."""
        now = time.monotonic()
        if done == 0:
            self._caching_since = now
        self.caching = CacheProgress(kind, done, total, now - self._caching_since)
        self.events.emit(self.caching)
        self._stop_point(sync=False)  # ranks write different entries: no collective here

    def _create_ema(self) -> EMA | None:
        if self.config.ema is EMAMode.OFF:
            return None
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        device = self.device if self.config.ema is EMAMode.GPU else torch.device("cpu")
        return EMA(params, self.config.ema_decay, self.config.ema_update_step_interval, device)

    def _check_placeholders(self) -> None:
        """An embedding whose placeholder appears in no caption or prompt learns nothing: say so before training."""
        captions = [c for entry in self.data.images for c in entry.captions]
        prompts = [s.prompt for s in (self.config.samples or [])]
        for placeholder, found in self.method.embeddings.mentioned_in(captions).items():
            if not found:
                self.warn(
                    f"no caption contains the embedding placeholder {placeholder}: the embedding will not learn. "
                    "Put it in the captions (or use the 'filename' / 'concept' prompt source with it)"
                )
        for placeholder, found in self.method.embeddings.mentioned_in(prompts).items():
            if prompts and not found:
                self.warn(f"no sample prompt contains {placeholder}: the samples will not show the embedding")

    def _set_train_mode(self) -> None:
        trained = set(self.method.trained_parts())
        for name, module in self.model.parts.items():
            module.train(name in trained)

    def _start_tensorboard(self) -> None:
        if not self.is_main:
            return
        self.events.sinks.append(TensorBoardSink(self.workspace.tensorboard_dir, self.config.samples_to_tensorboard))
        if self.config.tensorboard:
            self._launch_tensorboard(self.config.tensorboard_port)

    def _launch_tensorboard(self, port: int) -> None:
        output = self.workspace.dir("logs") / f"{self.workspace.run_name}-tensorboard.log"
        server = TensorBoardServer(self.workspace.dir("tensorboard"), port, self.config.tensorboard_expose, output)
        try:
            self.status(server.start())
            self.tensorboard_server = server
        except (OSError, RuntimeError) as e:
            self.warn(f"TensorBoard could not start: {e}")

    def _check_tensorboard(self) -> None:
        """A server that ended on its own (another run's server took the port between our check and its start) is
        started once more on the next free port; a second failure is reported with TensorBoard's own words."""
        server = self.tensorboard_server
        failure = server.failure() if server is not None else None
        if failure is None:
            return
        self.tensorboard_server = None
        if getattr(self, "_tensorboard_retried", False):
            self.warn(f"{failure}; TensorBoard is not available for this run")
            return
        self._tensorboard_retried = True
        self.warn(f"{failure}; starting it on another port")
        self._launch_tensorboard((server.port or self.config.tensorboard_port) + 1)

    def stop_tensorboard(self) -> None:
        if self.tensorboard_server is not None and not self.config.tensorboard_always_on:
            self.tensorboard_server.stop()

    def _emit_progress(self, total_steps: int, steps_per_epoch: int, step_times: list[float]) -> None:
        p = self.progress
        rate = len(step_times) / sum(step_times) if step_times and sum(step_times) > 0 else 0.0
        eta = (total_steps - p.global_step) / rate if rate > 0 else None
        self.events.emit(
            Progress(p.global_step, total_steps, p.epoch, self.config.epochs, p.epoch_step, steps_per_epoch, rate, eta)
        )

    def _nan_advice(self) -> str:
        c = self.config
        hints = []
        dtypes = {c.part(p).weight_dtype.value for p in self.model.parts}
        if "FLOAT_16" in dtypes or c.train_dtype.value == "FLOAT_16":
            hints.append("FLOAT_16 weights or training (try BFLOAT_16 or FLOAT_32, and a FLOAT_32 VAE)")
        hints.append(f"a learning rate that is too high ({c.learning_rate:g})")
        if c.optimizer.optimizer.is_adaptive:
            hints.append(f"the adaptive optimizer {c.optimizer.optimizer.value} (set the learning rate to 1)")
        return (
            f"the loss became NaN or infinite at step {self.progress.global_step + 1}; usual causes: "
            + "; ".join(hints)
            + ". The last backup is kept unchanged."
        )

    def status(self, text: str) -> None:
        self.events.emit(Status(text))

    def warn(self, text: str) -> None:
        self.events.emit(Warning_(text))
