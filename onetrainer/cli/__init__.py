"""Command-line entry points: `python -m onetrainer train|create-train-files|ui` and the scripts/ wrappers."""


def register_model_sources() -> None:
    """Register the named-model sources a user may name in a config (`tiny:sd15`, `tiny:images`: the offline demo),
    before a command loads one. Each command's `main` calls it, rather than this package importing them, so that
    importing a command's module (the library's and the tests' way in) loads no test models."""
    import onetrainer.tiny.source  # noqa: F401  (registers the `tiny:` source on import)
