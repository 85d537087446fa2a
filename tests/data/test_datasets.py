"""The data side: scanning odd and broken files, buckets, plans (keep-all and drop), captions, augmentation,
the cache (counted encoder calls), the preflight report, loaders with workers, validation and prior concepts."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.data.buckets import Bucket, bucket_grid, nearest_bucket
from onetrainer.data.plan import PlannedSample
from onetrainer.data.preflight import preflight_report
from onetrainer.data.training_data import DatasetError, TrainingData
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.training.checks import run_checks
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished, ListSink, Metrics, Warning_
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, read_scalars, tiny_config


def save(path, image: Image.Image, **kwargs) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **kwargs)


@pytest.fixture
def odd_folder(tmp_path):
    """Images of every mode and shape, captions of several lines, masks (one of the wrong size) and broken files."""
    folder = tmp_path / "odd"
    rgb = Image.new("RGB", (120, 60), (200, 10, 10))
    save(folder / "wide.png", rgb)
    save(folder / "tall.jpg", Image.new("RGB", (50, 150), (10, 200, 10)))
    save(folder / "square.webp", Image.new("RGB", (80, 80), (10, 10, 200)))
    save(folder / "alpha.png", Image.new("RGBA", (64, 64), (255, 0, 0, 0)))
    save(folder / "grey.bmp", Image.new("L", (70, 70), 128))
    save(folder / "palette.png", Image.new("P", (64, 64), 3))
    save(folder / "deep.tif", Image.fromarray(np.full((64, 64), 40000, dtype=np.uint16)))
    rotated = Image.new("RGB", (100, 60), (50, 50, 50))
    exif = rotated.getexif()
    exif[0x0112] = 6  # stored landscape, shown portrait
    save(folder / "rotated.jpg", rotated, exif=exif.tobytes())
    (folder / "wide.txt").write_text("first line\n\nsecond line\n", encoding="utf-8")
    (folder / "tall.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))  # not UTF-8
    save(folder / "wide-masklabel.png", Image.new("L", (120, 60), 255))
    save(folder / "tall-masklabel.png", Image.new("L", (10, 10), 255))  # the wrong size
    (folder / "empty.png").write_bytes(b"")
    truncated = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(truncated, format="PNG")
    (folder / "broken.png").write_bytes(truncated.getvalue()[:40])
    (folder / "notes.md").write_text("not an image")
    return folder


def data_for(config_dict, step: int = 8) -> TrainingData:
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == [], problems
    return TrainingData(config, step)


def test_scan_names_every_problem_and_reads_every_mode(odd_folder):
    data = data_for({"resolution": "64", "masked_training": True, "concepts": [{"path": str(odd_folder)}]})
    [scan] = data.scans
    names = {e.path.name for e in scan.images}
    assert names == {"wide.png", "tall.jpg", "square.webp", "alpha.png", "grey.bmp", "palette.png", "deep.tif",
                     "rotated.jpg"}  # fmt: skip
    assert {p.name for p, _ in scan.unreadable} == {"empty.png", "broken.png"}
    assert {p.name for p in scan.resized_masks} == {"tall-masklabel.png"}
    assert "square.webp" in {p.name for p in scan.missing_captions}
    assert any("tall.txt" in w and "Latin-1" in w for w in scan.caption_warnings)
    rotated = next(e for e in scan.images if e.path.name == "rotated.jpg")
    assert (rotated.width, rotated.height) == (60, 100)  # EXIF orientation honoured
    wide = next(e for e in scan.images if e.path.name == "wide.png")
    assert wide.captions == ("first line", "second line")

    from onetrainer.data.images import open_rgb

    assert open_rgb(odd_folder / "alpha.png").getpixel((0, 0)) == (255, 255, 255)  # transparency on white
    assert open_rgb(odd_folder / "deep.tif").getpixel((0, 0))[0] == 40000 // 256  # 16-bit scaled, not clipped


def test_buckets_follow_aspect_and_step():
    grid = bucket_grid(512, 64)
    assert all(b.width % 64 == 0 and b.height % 64 == 0 for b in grid)
    assert Bucket(512, 512) in grid and nearest_bucket(1000, 1000, grid) == Bucket(512, 512)
    wide = nearest_bucket(2000, 1000, grid)
    assert wide.width > wide.height and abs(wide.width * wide.height - 512 * 512) < 0.15 * 512 * 512
    assert nearest_bucket(100, 400, bucket_grid(512, 8)).aspect == pytest.approx(4.0, rel=0.05)


def test_plan_keeps_every_image_fills_batches_and_never_mixes_buckets(odd_folder):
    data = data_for({"resolution": "64", "batch_size": 3, "concepts": [{"path": str(odd_folder), "seed": 5}]})
    for epoch in range(3):
        plan = data.plan(epoch)
        assert all(len(batch) == 3 for batch in plan.batches)
        assert all(len({s.bucket for s in batch}) == 1 for batch in plan.batches)  # one shape per batch
        trained = {s.image for batch in plan.batches for s in batch if not s.filler}
        assert trained == set(range(len(data.images)))  # every valid image at least once
        assert plan.fillers and not plan.dropped
    assert data.plan(1).batches != data.plan(2).batches  # a new order each epoch, fixed by the seed
    again = data_for({"resolution": "64", "batch_size": 3, "concepts": [{"path": str(odd_folder), "seed": 5}]})
    assert again.plan(1).batches == data.plan(1).batches


def test_two_ranks_train_disjoint_halves_of_the_global_plan_keeping_every_image(odd_folder):
    settings = {"resolution": "64", "batch_size": 2, "concepts": [{"path": str(odd_folder), "seed": 5}]}
    one = data_for({**settings, "batch_size": 4})  # one process at the global batch
    ranks = [data_for(settings), data_for(settings)]
    for rank, data in enumerate(ranks):
        data.shard(rank, 2)
    for epoch in range(2):
        assert ranks[0].plan(epoch).batches == one.plan(epoch).batches  # planned at the global batch
        assert ranks[0].steps_in_epoch(epoch) == ranks[1].steps_in_epoch(epoch) == one.steps_in_epoch(epoch)
        for batch in one.plan(epoch).batches:
            halves = [data.local_part(batch) for data in ranks]
            assert [len(h) for h in halves] == [2, 2] and halves[0] + halves[1] == batch  # disjoint, in order
            assert len({s.bucket for s in batch}) == 1  # a bucket stays whole within a step
        trained = {s.image for batch in one.plan(epoch).batches for s in batch if not s.filler}
        assert trained == set(range(len(one.images)))  # every image kept, over the ranks together


def test_drop_incomplete_batches_lists_the_dropped(odd_folder):
    data = data_for(
        {"resolution": "64", "batch_size": 3, "drop_incomplete_batches": True, "concepts": [{"path": str(odd_folder)}]}
    )
    plan = data.plan(0)
    kept = {s.image for b in plan.batches for s in b}
    dropped = {s.image for s in plan.dropped}
    assert dropped and kept.isdisjoint(dropped) and kept | dropped == set(range(len(data.images)))
    assert not plan.fillers


def test_multi_resolution_draws_per_sample_and_epoch(tmp_path):
    folder = image_folder(tmp_path, count=8)
    data = data_for({"resolution": "64,128", "batch_size": 2, "concepts": [{"path": str(folder), "seed": 2}]})
    sizes = Counter(s.bucket for e in range(6) for b in data.plan(e).batches for s in b)
    assert set(sizes) == {Bucket(64, 64), Bucket(128, 128)}
    assert all(len({s.bucket for s in b}) == 1 for e in range(6) for b in data.plan(e).batches)
    exact = data_for({"resolution": "96x64", "concepts": [{"path": str(folder)}]})
    assert {s.bucket for b in exact.plan(0).batches for s in b} == {Bucket(96, 64)}
    override = data_for({"resolution": "64", "concepts": [{"path": str(folder), "image": {
        "enable_resolution_override": True, "resolution_override": "128"}}]})  # fmt: skip
    assert {s.bucket for b in override.plan(0).batches for s in b} == {Bucket(128, 128)}


def test_balancing(tmp_path):
    folder = image_folder(tmp_path, count=10)
    half = data_for({"resolution": "64", "batch_size": 1, "concepts": [{"path": str(folder), "balancing": 0.5}]})
    epochs = [{s.image for b in half.plan(e).batches for s in b} for e in range(4)]
    assert all(len(images) == 5 for images in epochs) and len(set(map(frozenset, epochs))) > 1
    exact = data_for({"resolution": "64", "batch_size": 1, "concepts": [
        {"path": str(folder), "balancing": 7, "balancing_strategy": "SAMPLES"}]})  # fmt: skip
    assert sum(len(b) for b in exact.plan(0).batches) == 7


def test_captions_pick_a_line_per_epoch_and_augment_deterministically(odd_folder):
    data = data_for({"resolution": "64", "batch_size": 1, "concepts": [{"path": str(odd_folder), "seed": 9, "text": {
        "enable_tag_shuffling": True, "keep_tags_count": 0}}]})  # fmt: skip
    wide = next(i for i, e in enumerate(data.images) if e.path.name == "wide.png")
    lines = set()
    for epoch in range(20):
        sample = next(s for b in data.plan(epoch).batches for s in b if s.image == wide)
        lines.add(data.load_batch([sample], epoch, False).captions[0])
    assert lines == {"first line", "second line"}


def test_augmentation_is_deterministic_per_seed_and_epoch(tmp_path):
    folder = image_folder(tmp_path, count=2)
    settings = {"enable_random_flip": True, "enable_random_rotate": True, "random_rotate_max_angle": 30,
                "enable_random_brightness": True, "random_brightness_max_strength": 0.4}  # fmt: skip
    config = {"resolution": "64", "batch_size": 2, "latent_caching": False,
              "concepts": [{"path": str(folder), "seed": 4, "image": settings}]}  # fmt: skip
    a, b = data_for(config), data_for(config)
    batch = a.plan(0).batches[0]
    assert torch.equal(a.load_batch(batch, 0, False).pixels, b.load_batch(batch, 0, False).pixels)
    other_epoch = [type(s)(s.image, s.bucket, s.variation + 1) for s in batch]
    assert not torch.equal(a.load_batch(batch, 0, False).pixels, a.load_batch(other_epoch, 1, False).pixels)


def test_an_images_augmentation_stays_when_images_come_before_it(tmp_path):
    """The draws follow the image, not its place in the scan: an image added in front of the others shifts every
    index, and each image is still cropped, flipped and turned as before (its cached latents stay what it gives)."""
    folder = image_folder(tmp_path, count=3)
    settings = {"enable_crop_jitter": True, "enable_random_flip": True, "enable_random_rotate": True,
                "random_rotate_max_angle": 30}  # fmt: skip
    config = {"resolution": "64", "batch_size": 1, "latent_caching": False,
              "concepts": [{"path": str(folder), "seed": 4, "image": settings}]}  # fmt: skip

    def pixels_by_name(data: TrainingData) -> dict[str, list[torch.Tensor]]:
        out = {}
        for index, entry in enumerate(data.images):
            samples = [PlannedSample(index, Bucket(48, 40), variation) for variation in range(4)]
            out[entry.path.name] = [data.load_batch([s], 0, False).pixels[0] for s in samples]
        return out

    before = pixels_by_name(data_for(config))
    Image.new("RGB", (72, 72), (10, 200, 30)).save(folder / "000-first.png")  # sorts first: every index moves
    after = pixels_by_name(data_for(config))
    assert len(after) == len(before) + 1
    for name, pixels in before.items():
        assert all(torch.equal(a, b) for a, b in zip(pixels, after[name])), name
    # the draws still differ between variations and between images
    first = next(iter(before.values()))
    assert any(not torch.equal(first[0], other) for other in first[1:])


def test_no_valid_image_is_an_error_before_anything_loads(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.png").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"no valid training image.*1 unreadable"):
        data_for({"concepts": [{"path": str(tmp_path / "empty")}, {"path": str(tmp_path / "junk")}]})


def test_preflight_report(odd_folder, tmp_path):
    config, _ = config_from_dict({
        "resolution": "64", "batch_size": 3, "masked_training": True, "cache_dir": str(tmp_path / "cache"),
        "concepts": [{"name": "odd", "path": str(odd_folder)}, {"name": "gone", "path": str(tmp_path / "nope")}],
    })  # fmt: skip
    report = preflight_report(config)
    odd, gone = report.concepts
    assert odd.images == 8 and {n.rsplit("/", 1)[-1] for n, _ in odd.unreadable} == {"empty.png", "broken.png"}
    assert sum(row.images for row in odd.buckets) == 8 and all(row.batches for row in odd.buckets)
    assert sum(row.repeated for row in odd.buckets) == len(report.fillers) > 0
    assert gone.problems == [f"folder not found: {tmp_path / 'nope'}"]
    assert report.steps_per_epoch == sum(-(-row.images // 3) for row in odd.buckets) == 5  # full batches per bucket
    assert report.total_steps == report.steps_per_epoch * config.epochs
    assert report.latents_to_encode > 0 and report.cached_latents == 0
    text = report.text()
    assert "empty.png" in text and "bucket" in text and "folder not found" in text and "Steps per epoch" in text


def test_preflight_counts_each_concepts_own_batches_and_calls_nothing_cached_before_it_is(tmp_path):
    many, few = tmp_path / "many", tmp_path / "few"
    for i in range(30):
        save(many / f"{i}.png", Image.new("RGB", (64, 64), (i, 0, 0)))
    for i in range(3):
        save(few / f"{i}.png", Image.new("RGB", (64, 64), (0, i, 0)))
    config, _ = config_from_dict({
        "resolution": "64", "batch_size": 3, "cache_dir": str(tmp_path / "cache"),
        "concepts": [{"name": "many", "path": str(many)}, {"name": "few", "path": str(few)}],
        "text_encoder": {"train": False},
    })  # fmt: skip
    report = preflight_report(config)
    many_report, few_report = report.concepts
    assert [r.images for r in many_report.buckets] == [30]
    # "few" has 3 images: at most 3 batches hold them, not the bucket's 11 batches of both concepts.
    assert 1 <= few_report.buckets[0].batches <= 3 < report.steps_per_epoch == 11
    assert many_report.buckets[0].batches >= 10
    text = report.text()
    assert "nothing cached yet" in text and "Text-encoder outputs: encoded once at the start" in text
    assert report.cached_latents == 0


# -- training with the cache -----------------------------------------------------------------------------------------


class CountingEncoder:
    """Counts the images and captions the family encodes (the cache must save exactly these)."""

    def __init__(self, monkeypatch):
        self.images = 0
        self.captions = 0
        original_images = StableDiffusionFamily.encode_images
        original_text = StableDiffusionFamily.encode_text

        def encode_images(family, model, pixels):
            self.images += len(pixels)
            return original_images(family, model, pixels)

        def encode_text(family, model, captions):
            self.captions += len(captions)
            return original_text(family, model, captions)

        monkeypatch.setattr(StableDiffusionFamily, "encode_images", encode_images)
        monkeypatch.setattr(StableDiffusionFamily, "encode_text", encode_text)


def run(config_dict):
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    return run_training(config, TrainingControl(), [sink]), sink


def test_cache_hits_and_misses_by_counting_encoder_calls(tmp_path, monkeypatch):
    folder = image_folder(tmp_path, count=4)
    counter = CountingEncoder(monkeypatch)
    config = tiny_config(tmp_path, epochs=2, text_encoder={"train": False}, only_cache=True)
    outcome, _ = run(config)
    assert isinstance(outcome, Finished) and outcome.reason == "cached"
    assert counter.images == 4 and counter.captions == 5  # 4 captions and the empty one (caption dropout)

    counter.images = counter.captions = 0
    outcome, _ = run({**config, "only_cache": False})
    assert isinstance(outcome, Finished) and counter.images == 0 and counter.captions == 0  # nothing re-encoded

    first = sorted(p for p in folder.glob("*.png") if "masklabel" not in p.name)[0]
    Image.new("RGB", (72, 72), (1, 2, 3)).save(first)
    counter.images = counter.captions = 0
    outcome, _ = run({**config, "only_cache": True})
    assert counter.images == 1 and counter.captions == 0  # only the changed image

    counter.images = 0
    outcome, _ = run({**config, "only_cache": True, "vae": {"weight_dtype": "BFLOAT_16"}})
    assert counter.images == 4  # another VAE data type: other latents


def test_text_is_encoded_every_step_while_the_text_encoder_trains(tmp_path, monkeypatch):
    image_folder(tmp_path, count=4)
    counter = CountingEncoder(monkeypatch)
    outcome, _ = run(tiny_config(tmp_path, epochs=1, text_encoder={"train": True}))
    assert isinstance(outcome, Finished) and counter.captions == 4 and counter.images == 4  # latents still cached


def test_broken_files_are_skipped_and_training_goes_on(tmp_path, odd_folder):
    config = tiny_config(tmp_path, epochs=1, concepts=[{"path": str(odd_folder), "seed": 1}])
    outcome, sink = run(config)
    assert isinstance(outcome, Finished)
    texts = " ".join(w.text for w in sink.of(Warning_))
    assert "empty.png: skipped" in texts and "broken.png: skipped" in texts


def test_leaving_images_out_renews_what_was_remembered_by_index(odd_folder):
    """An image that cannot be decoded is left out and the others' indices move: the remembered cache keys are those
    of the same files afterwards, not of whatever image now has the old index."""
    data = data_for({"concepts": [{"path": str(odd_folder), "seed": 1}], "resolution": "64", "batch_size": 1})
    data.latent_key_base = {"kind": "latents"}

    def by_file():
        samples = [s for batch in data.plan(0).batches for s in batch]
        return {data.images[s.image].path: data.latent_key(s, False) for s in samples}

    before = by_file()
    data.leave_out({0, 2})
    after = by_file()
    assert len(after) == len(before) - 2 and all(after[path] == before[path] for path in after)


def test_workers_start_once_per_run_and_give_the_same_losses(tmp_path, monkeypatch):
    """Worker processes load across epoch boundaries: a loader per epoch started its workers again at each one."""
    loaders = []

    class CountedLoader(torch.utils.data.DataLoader):
        def __iter__(self):
            loaders.append(self.num_workers)  # each iteration starts the loader's worker processes
            return super().__iter__()

    monkeypatch.setattr(torch.utils.data, "DataLoader", CountedLoader)
    image_folder(tmp_path, count=2)
    common = {"epochs": 2, "latent_caching": False}
    _, inline = run(tiny_config(tmp_path / "a", **common, concepts=[{"path": str(tmp_path / "images"), "seed": 3}]))
    assert loaders == []
    _, workers = run(tiny_config(tmp_path / "b", **common, dataloader_threads=1,
                                 concepts=[{"path": str(tmp_path / "images"), "seed": 3}]))  # fmt: skip
    assert loaders == [1]
    assert len(workers.of(Metrics)) == 2  # 2 epochs of 1 step
    assert [m.loss for m in inline.of(Metrics)] == pytest.approx([m.loss for m in workers.of(Metrics)], rel=1e-5)


def test_validation_concepts_are_logged_not_trained(tmp_path):
    folder = image_folder(tmp_path, count=4)
    other = tmp_path / "val"
    other.mkdir()
    for path in list(folder.glob("0[01]-*"))[:2]:
        (other / path.name).write_bytes(path.read_bytes())
    config = tiny_config(tmp_path, epochs=2, validation=True, validate_after=1, validate_after_unit="EPOCH",
                         concepts=[{"name": "train", "path": str(folder)},
                                   {"name": "held out", "path": str(other), "type": "VALIDATION"}])  # fmt: skip
    outcome, _ = run(config)
    assert isinstance(outcome, Finished)
    scalars = read_scalars(tmp_path / "workspace" / "tensorboard")
    assert [s for s, _ in scalars["loss/validation_step/held out"]] == [2, 4]
    assert scalars["loss/validation_step/total_average"][0][1] == scalars["loss/validation_step/held out"][0][1]
    assert len(scalars["loss/train_step"]) == 4  # 4 training images, batch 2, 2 epochs: validation is not trained


def test_prior_prediction_concepts_learn_the_base_models_prediction(tmp_path):
    image_folder(tmp_path, count=4)
    config = tiny_config(tmp_path, epochs=1, concepts=[{"path": str(tmp_path / "images"), "type": "PRIOR_PREDICTION"}])
    outcome, sink = run(config)
    assert isinstance(outcome, Finished)
    # The LoRA starts as the base model, so the base model's prediction is matched exactly: no loss, no drift.
    assert all(m.loss == 0.0 for m in sink.of(Metrics))
    cfg, _ = config_from_dict({**config, "training_method": "FINE_TUNE", "output_model_format": "DIFFUSERS"})
    assert any("PRIOR_PREDICTION" in p.message for p in run_checks(cfg))
