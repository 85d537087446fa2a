"""The names of the adapter kinds a LoRA run can train, as the file formats and the families refer to them.

They live here, below `methods/`, so that the key maps (`lycoris_keys.py`, `fused_transformer_lora.py`) and the
families can name a kind without importing the methods that train it.
"""

from __future__ import annotations

LORA, DORA, LOHA, LOKR, OFT = "lora", "dora", "loha", "lokr", "oft"
