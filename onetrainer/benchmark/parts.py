"""The benchmark parts that are no family's, in the order 'all' runs them (each family's overhead part runs after
'calls'), and the names a family's part may not take. Here, not in `cli.py`, because the registry of family parts
(`family_overhead.register_overhead`) checks new names against them and the CLI imports that registry."""

SHARED_PARTS = ("overhead", "calls", "offload", "caching", "weights", "memory", "tiny", "ddp", "split", "gpu", "gui")
RESERVED = (*SHARED_PARTS, "all", "presets")
