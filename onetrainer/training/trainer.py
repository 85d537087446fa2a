"""The training loop. `Trainer.run()` reads top to bottom: prepare (load the model, read the data, fill the caches),
build the optimizer, then epochs of steps, then the final save.

A step is one optimizer update (after gradient accumulation): intervals, totals, the LR schedule, TensorBoard's x-axis
and resume all count these. Every step draws its randomness from a generator seeded by the step number, so a run
resumed from a backup continues exactly as the uninterrupted run would have.

The loop is the same for one process and several (`distributed.py`): one process holds `SingleProcess`, whose
collectives have no one to meet. The Trainer keeps the order and the step; each phase's work is in a module of its
own: the cache passes, `preparation.py`; what the run says, `reporting.py`; the optimizer and what steps with it,
`optimization.py`; resuming, `resume.py`; the intervals, `periodic.py`; what rank 0 alone writes (samples, backups,
saves, the model, the validation record), `outputs.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ConceptType, LossWeight, MultiGpuMode, TrainingMethod
from onetrainer.data.loader import RunBatches
from onetrainer.data.plan import hash_seed
from onetrainer.data.training_data import Batch, TrainingData
from onetrainer.families import load_family_class
from onetrainer.families.base import BatchInputs, Conditioning, LoadedModel, PartRole
from onetrainer.families.sources import resolve_local
from onetrainer.methods import create_method
from onetrainer.noise.draws import perturb_noise, sample_noise
from onetrainer.noise.losses import latent_masks, mask_weights, per_pixel_loss, reduce_loss
from onetrainer.noise.weighting import timestep_weights
from onetrainer.precision.dtypes import fallback_dtype
from onetrainer.training.attention import attention_kernels
from onetrainer.training.checkpoint import TrainProgress
from onetrainer.training.control import TrainingControl
from onetrainer.training.devices import autocast, seed_step_generators, select_device
from onetrainer.training.distributed import (
    SINGLE,
    Distributed,
    GlobalDraws,
    SingleProcess,
    StoppedByRank,
    SyncedControl,
)
from onetrainer.training.events import BestCheckpoint, Broadcast, Finished, Metrics, Started, Status, Warning_
from onetrainer.training.optim import effective_learning_rates
from onetrainer.training.optimization import build_optimization
from onetrainer.training.outputs import Outputs, prepare_workspace
from onetrainer.training.periodic import Periodic
from onetrainer.training.placement import Placement, offloaded_parts, split_denoiser
from onetrainer.training.preparation import CacheFill, compile_denoiser
from onetrainer.training.processes import model_split_wanted, scaler_factor, split_devices
from onetrainer.training.reporting import check_placeholders, nan_advice, progress_event, report_scan
from onetrainer.training.resume import output_behind_backup, resume
from onetrainer.training.settings import StepSettings, shard_settings
from onetrainer.training.sharding import ShardedParts, load_in_turns, shard_parts
from onetrainer.training.tensorboard import RunTensorBoard
from onetrainer.training.validation import ValidationResult, range_fractions
from onetrainer.training.workspace import Workspace
from onetrainer.util.part_dtypes import parts_meet_safely
from onetrainer.util.threads import MODEL_LIBRARY_LOCK

if TYPE_CHECKING:
    from collections.abc import Iterator

    from onetrainer.config import TrainConfig


class NonFiniteLoss(RuntimeError):
    pass


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
        self.events = events
        self.workspace = workspace
        # Several processes (torchrun): commands come from the per-step sync, draws are sliced from the global batch,
        # outputs are rank 0's (see distributed.py). One process holds a stand-in with no one to meet, and reads its
        # commands live.
        if dist is None:
            # MODEL_SPLIT trains on the first of its devices, where the rest of the model lives.
            first = str(split_devices(config)[0]) if model_split_wanted(config) else config.train_device
            dist = SingleProcess(select_device(first, self.warn))
        else:
            control = SyncedControl(control)
        self.dist, self.control = dist, control
        self.world_size = dist.world_size
        self.draws = GlobalDraws(dist.rank, dist.world_size)
        self.progress = TrainProgress()
        self.resumed_from: Path | None = None
        self.tensorboard = RunTensorBoard(config, workspace, events, dist.is_main)
        self.cache_fill = CacheFill(events, lambda: self._stop_point(sync=False))
        # The family's loss terms of the micro-batches of a step (tensor, loss scale), read once the step is queued.
        self._family_losses: dict[str, list[tuple[torch.Tensor, float]]] = {}
        self.family_losses: dict[str, float] = {}  # their means over the last step, by TensorBoard tag
        self.last_validation: ValidationResult | None = None  # rank 0's
        self._validated_step = -1  # the step of the last validation (every rank)

    # =================================================================================================================
    def run(self) -> Finished:
        """The whole run; a stop before the first step ends it without writing anything."""
        try:
            with contextlib.ExitStack() as self._loaded:  # what the loaded model needs undone at the end
                return self._run()
        except (_StoppedEarly, StoppedByRank):
            self.dist.leave()
            return self._nothing_trained("stopped" if self.cache_fill.progress is None else "stopped during caching")
        except Exception as e:
            self.dist.leave(failure=f"{type(e).__name__}: {e}")
            raise

    def _nothing_trained(self, reason: str) -> Finished:
        # An untrained model (an all-zero LoRA) must never replace a trained one: nothing is written.
        destination = Path(self.config.output_model_destination).expanduser()
        kept = f" ({destination} is unchanged)" if destination.exists() else ""
        caching = self.cache_fill.progress
        if caching is not None:  # the entries written are whole files: the next run reads them instead of encoding
            done = f"{caching.done} of {caching.total} {caching.unit} were encoded ({caching.kind})"
            self.status(f"stopped during caching: {done} and stay in the cache for the next run")
        self.status(f"stopped before the first step: no step was trained, no model is written{kept}")
        return Finished(reason, "", 0)

    def _run(self) -> Finished:
        config = self.config
        prepare_workspace(config, self.workspace, self.as_given, self.events, self.dist.is_main)
        self._prepare()
        if config.only_cache:
            self.status("the cache is filled ('only cache' is on)")
            return Finished("cached")
        # As planned before resuming: the LR schedule's length, and the epoch's steps the start announces.
        total_steps, steps_per_epoch = self.data.total_steps(), self.data.steps_in_epoch(self.progress.epoch)
        self._build(total_steps, steps_per_epoch)
        if self.progress.epoch >= config.epochs:
            return self._trained_already()

        self._announce(total_steps, steps_per_epoch)
        self._loop(total_steps)
        return self._finish()

    def _prepare(self) -> None:
        """Everything before the optimizer: load and place the model, read the data, set up the method, fill the
        caches."""
        config = self.config
        self.device = self.dist.device
        self.step_devices = [self.device]  # the devices whose generators each step seeds
        self.status("loading the model")
        with MODEL_LIBRARY_LOCK:  # not beside the app's estimate worker importing the same libraries
            self.family = load_family_class(config.model_type)()
            self.model = self._load()
        # Parts in different dtypes (a bf16 denoiser, a float32 VAE) meet in caching, the loss, validation and samples.
        self._loaded.enter_context(parts_meet_safely(self.model.parts.values()))
        # CUDNN / FLASH: that attention kernel first for every step and sample of the run (`training/attention.py`).
        self._loaded.enter_context(attention_kernels(config.attention_mechanism))
        family = self.family
        self.placement = Placement(self.model.parts, family.part_roles, family.sampling_parts, self.device)
        offloaded = offloaded_parts(config, family)
        # MODEL_SPLIT: the denoiser's blocks spread over the split devices, never whole on the first.
        split = [family.denoiser_part] if model_split_wanted(config) else []
        # SHARDED: the trained parts wait in host RAM; sharding moves them to the device a block at a time, so no GPU
        # ever holds one whole (the reason to shard is that it would not fit).
        self.on_host_until_sharded = self._sharded_parts()
        self.placement.wait_on_host(self.on_host_until_sharded)
        # Parts no step of this run runs (`Family.idle_parts`) wait in host memory as the sampling parts do.
        idle = family.idle_parts(self.model)
        # Offloaded parts reach the device through their offloader once the method's adapters exist (never whole).
        self.placement.place(
            n
            for n, role in family.part_roles.items()
            if role is not PartRole.SAMPLING and n not in offloaded and n not in split
            and n not in self.on_host_until_sharded and n not in idle
        )  # fmt: skip
        self._stop_point()
        self.status("reading the training images")
        self.data = TrainingData(config, self.model.type_info.family.bucket_step, resolve_local)
        self.data.shard(self.dist.rank, self.dist.world_size)
        report_scan(self.data, config, self.warn, self.status)
        torch.manual_seed(hash_seed(self.data.seed, 0x5EED))  # adapters initialise the same way every run
        self.method = create_method(config, self.family, self.model, self.device)
        for notice in self.method.notices:
            self.warn(notice)
        for part, offload in offloaded.items():
            self.placement.offload_layers(part, offload(self.model.part(part)))
        if split:  # the blocks (with their adapters) on their devices, sized by the devices' free memory now
            model_split = split_denoiser(family, self.model, split_devices(config))
            self.placement.split_part(split[0], model_split)
            self.step_devices = list(dict.fromkeys(model_split.devices))  # a block's dropout draws on its device
            self.status(f"{split[0]} split over {len(model_split.devices)} devices: {model_split.describe()}")
        # Now on the device as the others are: a window of blocks at a time, or spread (caching encodes with them).
        if offloaded or split:
            self.placement.place(
                n
                for n, role in family.part_roles.items()
                if role is not PartRole.SAMPLING and n not in self.on_host_until_sharded and n not in idle
            )
        check_placeholders(self.data, config, self.method, self.warn)
        self.with_masks = config.masked_training or self.model.type_info.inpainting
        self.text_cache = None
        self._stop_point()
        if config.latent_caching:
            self.text_cache = self.cache_fill.fill(
                config, self.data, family, self.model, self.method, self.with_masks, self.dist
            )
        # Frozen encoders whose outputs are cached leave the device (they come back to sample and validate).
        trained = self.method.trained_parts()
        per_step = self.placement.per_step(trained, config.latent_caching, self.text_cache is not None)
        self.placement.place(n for n in per_step if n not in self.on_host_until_sharded and n not in idle)

    def _load(self) -> LoadedModel:
        """The model. A sharded fine-tune's processes read it one at a time, rank 0 last, each other process keeping
        the parts it will shard without their weights (rank 0 sends it its shards when they are cut): one whole model
        in host RAM at a time, not one per process (`sharding.load_in_turns`)."""
        if not self._shards_from_rank0():
            return self.family.load(self.config)
        turn = self.dist.rank if self.dist.rank else self.world_size  # rank 0 last
        self.status(f"the {self.world_size} processes read the model one at a time: this one's turn is {turn}")
        return load_in_turns(self.dist, lambda: self.family.load(self.config), self._sharded_parts)

    def _shards_from_rank0(self) -> bool:
        """Whether the parts to shard are loaded by rank 0 alone (`_load`): a sharded fine-tune on several processes
        (other methods are refused as they are sharded, `_shard`)."""
        config = self.config
        sharded = config.multi_gpu_mode is MultiGpuMode.SHARDED and self.world_size > 1
        return sharded and config.training_method is TrainingMethod.FINE_TUNE

    def _sharded_parts(self, model: LoadedModel | None = None) -> list[str]:
        """The parts a sharded run shards (a fine-tune's trained denoiser and text encoders) of `model` (None: the
        run's); none otherwise."""
        if self.config.multi_gpu_mode is not MultiGpuMode.SHARDED or self.world_size <= 1:
            return []
        model = model or self.model
        candidates = [*self.family.denoiser_parts, *(s.part for s in model.text_encoders)]
        return [p for p in candidates if self.config.part(p).train]

    def _build(self, total_steps: int, steps_per_epoch: int) -> None:
        """The optimizer and what steps with it, what rank 0 writes, and the last backup's state when resuming."""
        config = self.config
        self.method.enable_gradient_checkpointing()
        if config.compile:
            compile_denoiser(self.family, self.model, self.device, self.warn, self.status)
        # SHARDED (several processes): the trained parts split over them before the optimizer is built on the shards.
        self.sharding = self._shard() if config.multi_gpu_mode is MultiGpuMode.SHARDED and self.world_size > 1 else None
        self.optimization = build_optimization(
            config,
            self.method.param_groups(),
            self.device,
            self.world_size,
            total_steps,
            steps_per_epoch,
            self.placement.offloads,
        )
        self.outputs = Outputs(
            config,
            self.workspace,
            self.events,
            self.dist.is_main,
            self.family,
            self.model,
            self.method,
            self.device,
            self.placement,
            self.optimization,
            self.sharding,
        )
        if self.sharding is not None:
            sizes = self.sharding.sizes(self.optimization.optimizer)
            self.status(
                f"sharded over {self.world_size} processes: this one holds {sizes.weights_local:,} of the "
                f"{sizes.weights_whole:,} trained weights"
            )
        if config.continue_last_backup:
            self._resume()
        if self.validating:
            self.outputs.open_record(self.progress.global_step if self.resumed_from is not None else None)
        self._stop_point()

    def _shard(self) -> ShardedParts:
        """The trained parts of a fine-tune, each declared block and then the part sharded with FSDP2."""
        if self.config.training_method is not TrainingMethod.FINE_TUNE:
            method = self.config.training_method.value
            raise ValueError(f"multi_gpu_mode SHARDED trains fine-tunes only; {method} trains data parallel for now")
        parts = self.method.trained_parts()
        if self._shards_from_rank0() and set(parts) != set(self._sharded_parts()):
            loaded = self._sharded_parts()
            raise RuntimeError(f"the parts loaded to be sharded ({loaded}) are not the ones that train ({parts})")
        settings = shard_settings(self.config)
        sharded = shard_parts(self.family, self.model, parts, settings, self.dist, self._shards_from_rank0())
        self.placement.mark_sharded(parts)
        for part in parts:
            blocks = sharded.blocks[part]
            unit = f"{blocks} blocks and the rest" if blocks else "one unit (the family declares no blocks for it)"
            self.status(f"{part} sharded over {self.world_size} processes as {unit}")
        return sharded

    def _resume(self) -> None:
        folder = self.workspace.dir("backup")
        resumed = resume(self.config, folder, self.method, self.optimization, self.placement, self.warn, self.sharding)
        if resumed is None:
            return
        backup, self.progress = resumed
        self.resumed_from = self.outputs.last_backup = backup
        p = self.progress
        self.outputs.backup_step = p.global_step
        self.status(f"resumed from {backup.name}: epoch {p.epoch + 1}, step {p.global_step}")

    def _trained_already(self) -> Finished:
        """A resumed run whose epochs are all trained: its model is saved when the backup is newer, else it ends."""
        epochs = self.config.epochs
        if output_behind_backup(self.config, self.resumed_from):
            self.status(f"all {epochs} epochs are trained; the model was never saved from this backup: saving")
            self._checkpoint_validation()
            output = self.save_final()
            return Finished("completed", str(output), self.progress.global_step)
        self.status(f"all {epochs} epochs are already trained; raise 'epochs' to train further")
        return Finished("nothing to do", global_step=self.progress.global_step)

    def _announce(self, total_steps: int, steps_per_epoch: int) -> None:
        """TensorBoard (rank 0's), and the start of training with the best checkpoint of the runs this one resumed."""
        self.tensorboard.start()
        w = self.workspace
        self.events.emit(
            Started(w.run_name, total_steps, self.config.epochs, steps_per_epoch, str(w.log_path), str(w.root))
        )
        best = self.outputs.best()
        if best is not None:
            self.events.emit(BestCheckpoint(best.path, best.label, best.loss))

    def _loop(self, total_steps: int) -> None:
        """Epochs of steps, with validation, samples, backups and saves at their intervals and on request."""
        config, progress, optimization = self.config, self.progress, self.optimization
        due = Periodic.start(config, self.validating, self.dist)
        self.method.update_freezing(progress.global_step, progress.epoch)
        self._set_train_mode()
        if optimization.schedule_free:
            optimization.optimizer.train()
        smooth_loss = None
        step_times: list[float] = []

        # One loader for the rest of the run: its workers start once and load ahead across epoch boundaries.
        run_batches = RunBatches(
            self.data,
            progress.epoch,
            progress.epoch_step,
            self.with_masks,
            self.text_cache is not None,
            config.dataloader_threads,
        )
        self._loaded.callback(run_batches.close)
        for epoch in range(progress.epoch, config.epochs):
            progress.epoch = epoch
            steps_per_epoch = self.data.steps_in_epoch(epoch)
            for batches in run_batches.epoch(epoch):
                if self.control.stop_requested:
                    break
                started = time.monotonic()
                loss = self.train_step(batches)
                progress.epoch_step += 1
                progress.global_step += 1
                step_times = [*step_times[-19:], time.monotonic() - started]

                n = progress.global_step
                smooth_loss = loss if smooth_loss is None else smooth_loss + (loss - smooth_loss) * max(0.01, 1 / n)
                extra = {"ema_decay": optimization.ema.current_decay()} if optimization.ema else {}
                extra.update(self.family_losses)
                self.events.emit(Metrics(n, loss, smooth_loss, effective_learning_rates(optimization.optimizer), extra))
                self.events.emit(progress_event(progress, total_steps, config.epochs, steps_per_epoch, step_times))
                self.tensorboard.check()

                frozen = self.method.update_freezing(n, epoch)
                if frozen:
                    self.status(f"stopped training: {', '.join(frozen)}")
                # Validation first: a save or backup at the same step records its loss without measuring it again.
                if due.validate.after_step(n):
                    self.validate()
                if due.sample.after_step(n) or self.control.take("sample"):
                    self.sample()
                if due.backup.after_step(n) or self.control.take("backup"):
                    self.backup()
                if due.save.after_step(n) or self.control.take("save"):
                    self.save_intermediate()
            if progress.epoch_step >= steps_per_epoch:
                progress.epoch, progress.epoch_step = epoch + 1, 0
                if due.validate.after_epoch(epoch + 1):
                    self.validate()
                if due.sample.after_epoch(epoch + 1):
                    self.sample()
                if due.backup.after_epoch(epoch + 1):
                    self.backup()
                if due.save.after_epoch(epoch + 1):
                    self.save_intermediate()
            if self.control.stop_requested:
                break
        run_batches.close()

    def _finish(self) -> Finished:
        """After the last step (or a stop): a backup if asked, then the model."""
        if self.progress.global_step > 0:
            self._checkpoint_validation()  # while the ranks still meet: the final backup and model record it
        self.dist.left = True  # the ranks part here: rank 0 alone writes the backup and the model
        reason = "stopped" if self.control.stop_requested else "completed"
        if self.progress.global_step == 0:
            return self._nothing_trained(reason)
        if self.config.backup_before_save and self.outputs.backup_step != self.progress.global_step:
            self.backup()
        output = self.save_final()
        return Finished(reason, str(output), self.progress.global_step)

    # =================================================================================================================
    def train_step(self, batches: list[Batch]) -> float:
        """One optimizer step over `batches` (gradient accumulation); returns the mean loss of the micro-batches."""
        seed = hash_seed(self.data.seed, self.progress.global_step)
        for device in self.step_devices:  # adapter dropout and anything else that uses the global generators
            seed_step_generators(seed, device)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        losses = []
        self._family_losses = {}
        optimization = self.optimization
        fused, scaler, optimizer = optimization.fused, optimization.grad_scaler, optimization.optimizer
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
                        raise NonFiniteLoss(nan_advice(self.config, self.model, self.progress.global_step))
                    fused.stepping = index == len(batches) - 1
                scaler.scale(loss).backward()
            losses.append(loss.detach())
        # The losses are read once, after every backward pass has been queued: each read waits for the device, and a
        # wait between the forward and the backward pass would leave an accelerator idle while the backward launches.
        # A non-finite loss is still caught before the optimizer step, so the weights stay as they were.
        values = torch.stack(losses).cpu().tolist() if len(losses) > 1 else [losses[0].item()]
        if not all(math.isfinite(v) for v in values):
            raise NonFiniteLoss(nan_advice(self.config, self.model, self.progress.global_step))
        total = 0.0
        for value in values:  # summed as Python floats, in order, as before (resume compares losses exactly)
            total += value
        self.family_losses = {
            f"loss/{k}": sum(float(t) * s for t, s in v) / len(batches) for k, v in self._family_losses.items()
        }
        if self.world_size > 1:  # one process has nothing to exchange, and its step makes no call for it
            total = self._sync_step(total)
        params = optimization.params
        if fused is not None:
            fused.finish()  # every trained weight was updated as its gradient arrived
        elif any(p.grad is not None for p in params):
            scaler.unscale_(optimizer)
            if self.config.clip_grad_norm is not None:
                # clip_grad_norm_ skips parameters without a gradient (frozen parts).
                torch.nn.utils.clip_grad_norm_(params, self.config.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
        else:  # no gradient this step (an embedding's placeholder in no caption): a grad scaler refuses to step
            optimizer.step()
        optimization.lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if optimization.ema is not None:
            optimization.ema.after_step(self.progress.global_step + 1)
        return total

    def _sync_step(self, loss: float) -> float:
        """Every rank's status, the commands and the loss in one all-reduce, then the averaged gradients."""
        result = self.dist.sync(self.control.local, loss)
        self.control.update(result)
        if self.sharding is None:  # sharded gradients were reduce-scattered (averaged) in the backward pass
            params = [p for p in self.optimization.params if p.requires_grad]
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
        text_references = references if self.data.text_with_references else None  # else they reach `predict` alone
        drops = self._caption_drops(len(captions), generator)
        if any(d is not None for d in drops):  # the family knows where each encoder's share of the conditioning is
            encode = lambda c: self._encode_captions(c, batch, text_references)  # noqa: E731
            conditioning = family.drop_captions(model, captions, drops, encode)
        else:
            conditioning = self._encode_captions(captions, batch, text_references)

        schedule = model.schedule
        # Drawn at the global batch's size and sliced (`distributed.GlobalDraws`; the whole batch in one process).
        draws, size = self.draws, self.draws.size(len(latents))
        global_noise = sample_noise(draws.like(latents), generator, settings.draws)
        noise = draws.mine(global_noise).to(latents.device, latents.dtype)
        if timesteps is None:
            drawn = schedule.sample_times(size, generator, settings.timesteps, self.device, latents.shape)
            timesteps = draws.mine(drawn)
        perturbed = draws.mine(perturb_noise(global_noise, generator, settings.draws)).to(latents.device)
        noisy = schedule.add_noise(latents, perturbed, timesteps)

        keep_unmasked = draws.mine(torch.rand(size, generator=generator)) < config.unmasked_probability
        inputs = BatchInputs(
            latents=latents,
            pixels=self._pixels(batch),
            original_sizes=batch.original_sizes,
            crop_offsets=batch.crop_offsets,
            input_masks=self._input_masks(batch, keep_unmasked),
            keep_unmasked=keep_unmasked,
            cached={k: v.to(self.device) for k, v in batch.cached_extras.items()},
            references=references,
            depths=[d.to(self.device) if d is not None else None for d in batch.depths] if batch.depths else None,
        )
        # Every copy to the device happens before the forward pass: a copy from (pageable) CPU memory waits for what the
        # device has queued, so one after the forward would hold the backward pass back until the forward has run.
        sample_weights = batch.loss_weights.to(self.device)
        weights = None
        if config.masked_training and batch.masks is not None:
            small = latent_masks(batch.masks, latents.shape, family.info.video).to(self.device)
            weights = mask_weights(small, keep_unmasked.to(self.device), config.unmasked_weight)
        prior = [t is ConceptType.PRIOR_PREDICTION for t in batch.concept_types]
        rows = (-1,) + (1,) * (latents.dim() - 1)
        prior_rows = torch.tensor(prior, device=self.device).view(rows) if any(prior) else None
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
        self.outputs.report("validating")
        self._validated_step = self.progress.global_step
        fractions = range_fractions()
        measured: dict[int, tuple[str, list[float]]] = {}
        draws, self.draws = self.draws, SINGLE  # each image's batch whole, on the rank that measures it
        for module in self.model.parts.values():
            module.eval()
        with torch.no_grad(), self.outputs.resharded(), self.optimization.inference_weights():
            self._validate_each(fractions, measured)
        self.draws = draws
        self._set_train_mode()
        measured = {i: v for part in self.dist.all_gather_object(measured) for i, v in part.items()}
        result = self.outputs.validated(measured, self.progress)
        if result is not None:
            self.last_validation = result
        return result

    def _validate_each(self, fractions, measured: dict[int, tuple[str, list[float]]]) -> None:
        """Measure this rank's share of the validation images into `measured` (index → concept, one loss per range)."""
        with self.placement.for_encoding():
            for index, batch, counted in self._validation_batches():
                batch = dataclasses.replace(batch, latents=self._latents(batch))  # encoded once for every range
                losses = []
                for fraction in fractions:
                    generator = torch.Generator(device="cpu").manual_seed(hash_seed(self.data.seed, index, 0xFA1))
                    times = self.model.schedule.validation_times(fraction.repeat(batch.size), self.device)
                    with autocast(self.device, self.config.train_dtype):
                        losses.append(float(self.batch_loss(batch, generator, times)))
                if not counted:
                    continue  # a stand-in's measure (sharded): computed in step with the others, recorded by its rank
                concept = self.config.concepts[self.data.validation_images[index].concept]
                measured[index] = (concept.name or concept.path, losses)

    def _validation_batches(self) -> Iterator[tuple[int, Batch, bool]]:
        """This rank's share of the validation images: (index, batch, whether its loss counts). Sharded, every rank
        must compute as often as the others (each forward gathers the blocks' shards from all of them): a rank with
        fewer images (their count does not divide, or one failed to load) measures stand-ins after its own, which do
        not count, up to the busiest rank's count."""
        shares = self.data.validation_batches(self.with_masks, self.dist.rank, self.dist.world_size)
        if self.sharding is None:
            yield from ((index, batch, True) for index, batch in shares)
            return
        own = list(shares)
        rounds = max(self.dist.all_gather_object(len(own)))
        yield from ((index, batch, True) for index, batch in own)
        if len(own) < rounds:
            index, stand_in = own[-1] if own else next(iter(self.data.validation_batches(self.with_masks)))
            for _ in range(rounds - len(own)):
                yield index, stand_in, False

    def _checkpoint_validation(self) -> ValidationResult | None:
        """The validation of the weights as they are now, for a checkpoint: the last one when it was at this step,
        else measured now (on every rank; once the ranks have parted, rank 0 records the last one)."""
        if not self.validating:
            return None
        if self._validated_step != self.progress.global_step and not self.dist.left:
            self.validate()
        return self.last_validation

    # =================================================================================================================
    def sample(self) -> None:
        if self.outputs.sample(self.progress):
            self._set_train_mode()

    def backup(self) -> Path | None:
        """Write a backup; a failure (a full disk) is a warning and training goes on."""
        return self.outputs.backup(self.progress, self._checkpoint_validation())

    def save_intermediate(self) -> None:
        self.outputs.save(self.progress, self._checkpoint_validation())

    def save_final(self) -> Path:
        """Write the model. When that fails, the trained state is kept in a backup and the message says how to save
        it (resume saves a model that is missing or older than the last backup)."""
        validation = self.last_validation if self._validated_step == self.progress.global_step else None
        return self.outputs.save_final(self.progress, validation, self.backup)

    def stop_tensorboard(self) -> None:
        self.tensorboard.stop()

    # =================================================================================================================
    def _stop_point(self, sync: bool = True) -> None:
        """Before the first step, end the run when a stop was requested. At a phase boundary every rank passes (`sync`),
        a stop on any rank stops all of them; elsewhere (caching: ranks write different entries) this rank's own."""
        if sync:
            result = self.dist.sync(self.control.local)
            self.control.update(result)
            if result.stop and self.progress.global_step == 0:
                self.dist.left = True  # every rank ends now, knowing it
                raise _StoppedEarly
        elif self.control.local.stop_requested and self.progress.global_step == 0:
            raise _StoppedEarly  # said to the others by `leave` (run())

    def _set_train_mode(self) -> None:
        trained = set(self.method.trained_parts())
        for name, module in self.model.parts.items():
            module.train(name in trained)

    def status(self, text: str) -> None:
        self.events.emit(Status(text))

    def warn(self, text: str) -> None:
        self.events.emit(Warning_(text))
