"""RunPod pods as cloud hosts: not built yet (the LINUX type trains on any SSH host)."""

from __future__ import annotations

from onetrainer.remote.settings import CloudError, CloudSecrets, CloudSettings
from onetrainer.training.events import Broadcast


class RunPodProvider:
    def __init__(self, settings: CloudSettings, secrets: CloudSecrets) -> None:
        raise CloudError(
            "cloud.type RUNPOD is not built yet: use LINUX with the pod's SSH host and port in the secrets"
        )

    def prepare(self, events: Broadcast) -> CloudSecrets:  # pragma: no cover
        raise NotImplementedError

    def act(self, action: str, events: Broadcast, setting: str) -> None:  # pragma: no cover
        raise NotImplementedError
