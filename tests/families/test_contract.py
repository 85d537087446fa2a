"""The generic pieces of the family contract on small tensors: named conditioning (cache rows, stacking, dropout by
zeros) and the production code's independence from the test-support package."""

from __future__ import annotations

import subprocess
import sys

import torch

from onetrainer.families.base import Conditioning


def test_conditioning_rows_stack_back_and_zero_per_caption():
    hidden = torch.randn(3, 4, 8, dtype=torch.float16)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    conditioning = Conditioning({"hidden_states": hidden, "attention_mask": mask, "pooled": torch.randn(3, 8)})
    rows = [conditioning.row(i) for i in range(3)]
    assert rows[0]["hidden_states"].dtype == torch.float32 and rows[0]["attention_mask"].dtype == mask.dtype
    stacked = Conditioning.stack(rows, "cpu")
    assert set(stacked.tensors) == {"hidden_states", "attention_mask", "pooled"} and len(stacked) == 3
    assert torch.equal(stacked.get("attention_mask"), mask)
    assert torch.allclose(stacked.hidden_states, hidden.float())
    dropped = stacked.zeroed(torch.tensor([False, True, False]))
    assert torch.equal(dropped.get("attention_mask")[1], torch.zeros(4, dtype=mask.dtype))
    assert not dropped.hidden_states[1].any() and not dropped.pooled[1].any()
    assert torch.equal(dropped.hidden_states[0], stacked.hidden_states[0])


def test_production_code_does_not_import_the_test_models():
    """Training, sampling and the families load without `onetrainer.tiny` (it is imported only for `tiny:` names)."""
    code = (
        "import sys, onetrainer.training.trainer, onetrainer.families.sd, onetrainer.families.sdxl, "
        "onetrainer.cli.sample; print([m for m in sys.modules if m.startswith('onetrainer.tiny')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
