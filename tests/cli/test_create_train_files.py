"""scripts/create_train_files.py writes a config whose concept and sample files load back."""

from __future__ import annotations

from onetrainer.cli.create_train_files import main
from onetrainer.config import errors, load_config, pack


def test_writes_loadable_files_and_never_overwrites_unasked(in_tmp, capsys):
    args = [
        "--config-output-destination",
        "cfg.json",
        "--concepts-output-destination",
        "c.json",
        "--samples-output-destination",
        "s.json",
    ]
    assert main(args) == 0
    config, problems = load_config("cfg.json")
    assert errors(problems) == [] and config.concept_file_name == "c.json"
    packed, problems = pack(config)
    assert problems == [] and len(packed.concepts) == 1 and len(packed.samples) == 1
    (in_tmp / "c.json").write_text("[]")
    assert main(args) == 2
    assert "use --force" in capsys.readouterr().err
    assert (in_tmp / "c.json").read_text() == "[]"
    assert main([*args, "--force", "--preset", "sd21/lora-768"]) == 0
    config, _ = load_config("cfg.json")
    packed, _ = pack(config)
    assert config.resolution == "768" and packed.samples[0].width == 768
