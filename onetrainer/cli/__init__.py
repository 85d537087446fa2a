"""Command-line entry points: `python -m onetrainer train|create-train-files|ui` and the scripts/ wrappers."""
