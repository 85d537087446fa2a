"""Several training processes fill one cache: every missing entry is encoded by exactly one rank, even when one rank
reaches the cache long before another (two threads stand for two processes; the encoder is a stand-in)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from onetrainer.config import TrainConfig
from onetrainer.data import caching
from onetrainer.families.base import PartRole

KEYS = [f"{i:02d}" + "k" * 30 for i in range(12)]


class _Ranks:
    """`Distributed`'s barrier and all-gather for threads."""

    def __init__(self, rank: int, world_size: int, meeting: threading.Barrier, gathered: list) -> None:
        self.rank, self.world_size, self.meeting, self.gathered = rank, world_size, meeting, gathered

    def barrier(self) -> None:
        self.meeting.wait(timeout=20)

    def all_gather_object(self, value) -> list:
        self.gathered[self.rank] = value
        self.meeting.wait(timeout=20)
        return list(self.gathered)


def test_two_ranks_encode_every_missing_entry_once_even_when_one_starts_late(tmp_path, monkeypatch):
    encoded: list[tuple[int, str]] = []

    def encode(data, family, model, missing, with_masks, report, stats):
        for key, _ in missing:
            encoded.append((data.rank, key))
            data.latent_cache.put(key, {"latents": torch.zeros(1)})
        return {}

    monkeypatch.setattr(caching, "_encode_latents", encode)
    monkeypatch.setattr(caching, "needed_samples", lambda data, config, masked: {key: None for key in KEYS})
    config = TrainConfig()
    config.cache_dir = str(tmp_path / "cache")
    meeting, gathered = threading.Barrier(2), [None, None]

    def rank(index: int, delay: float) -> None:
        time.sleep(delay)  # rank 1 loads its model slowly: rank 0 must not have written anything yet
        data = SimpleNamespace(rank=index, images=[])
        family = SimpleNamespace(part_roles={"vae": PartRole.IMAGE_ENCODER})  # what the cache is keyed on
        caching.fill_latent_cache(data, family, None, config, False, print, _Ranks(index, 2, meeting, gathered))

    threads = [threading.Thread(target=rank, args=(0, 0.0)), threading.Thread(target=rank, args=(1, 0.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(key for _, key in encoded) == KEYS  # each once
    assert {r for r, _ in encoded} == {0, 1}  # and the work was split
