"""The package's layers: no import loop, no import from a lower layer up to a higher one, and family knowledge only on
the family side (`docs/architecture.md`, "Layers").

The imports are read from the source (function-level imports count; those under `if TYPE_CHECKING:` do not), so a
loop that only shows at run time on some path is caught too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "onetrainer"

# Lowest first. A module may import from its own layer and the layers below it. The utilities are generic and import
# nothing of the config; what reads the config's data types (`precision`) stands above it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("util", "resources"),
    ("memory",),
    # The family registry is import strings only: the model-type table (config) reads the families' declarations
    # through it (`config/model_types.py`).
    ("config", "families.registry"),
    ("precision",),
    ("weights",),
    ("sampling",),
    ("noise",),
    ("families",),
    ("data",),
    ("methods",),
    ("tiny",),
    # Remote training is a way to run training (`run_training` hands a cloud config to it); its agent is the
    # host-side program, a command line of its own.
    ("training", "remote"),
    ("tools",),
    ("cli", "benchmark", "__main__", "remote.agent"),
)

# Family knowledge: the family modules and their declarations (and their tiny models, key maps and benchmarks) may name
# the families; the enums hold OneTrainer's names of the model types. Everything else speaks of parts and roles.
FAMILY_SIDE = ("families/", "tiny/", "weights/", "benchmark/", "config/enums.py")
# (`effnet_encoder` is also the name of OneTrainer's config block of that part: a part name, allowed as such.)
# ("chroma" alone is also the colour term of the image augmentations: the family's names are matched.)
FAMILY_WORDS = re.compile(
    r"pixart|wuerstchen|würstchen|cascade|sdxl|effnet(?!_encoder)|\bt5\b|\bflux|\bbfl\b|chroma_?1|chroma(pipeline|transformer|family)"
    r"|ideogram",
    re.IGNORECASE,
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def owner(target: str) -> str:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target

    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {owner(a.name) for a in node.names if a.name.startswith("onetrainer.")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base.startswith("onetrainer"):
                found |= {owner(f"{base}.{a.name}") if f"{base}.{a.name}" in known else owner(base) for a in node.names}
    return found - {name, "onetrainer", ""}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _layer(module: str) -> int:
    inner = module.removeprefix("onetrainer.")
    best = None
    for index, names in enumerate(LAYERS):
        for prefix in names:
            matches = inner == prefix or inner.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no layer: add its package to LAYERS in tests/test_layers.py"
    return best[0]


def test_no_import_runs_from_a_lower_layer_up():
    upward = [
        f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
        for a, targets in _graph().items()
        if a != "onetrainer"
        for b in sorted(targets)
        if _layer(b) > _layer(a)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_loop():
    graph = _graph()
    state: dict[str, int] = {}
    loops: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                loops.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not loops, "\n".join(" -> ".join(loop) for loop in loops)


def test_family_names_stay_on_the_family_side():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(FAMILY_SIDE):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FAMILY_WORDS.search(line):
                found.append(f"onetrainer/{relative}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_layer_test_sees_a_loop_and_an_upward_import(tmp_path):
    """The checks above must be able to fail: a planted upward import is found by the same reading."""
    known = {"onetrainer.config.x": tmp_path / "x.py", "onetrainer.training.y": tmp_path / "y.py"}
    known["onetrainer.config.x"].write_text("def f():\n    from onetrainer.training.y import g\n")
    known["onetrainer.training.y"].write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from onetrainer.config.x import f\n"
    )
    assert _imports("onetrainer.config.x", known["onetrainer.config.x"], known) == {"onetrainer.training.y"}
    assert _imports("onetrainer.training.y", known["onetrainer.training.y"], known) == set()
    assert _layer("onetrainer.training.y") > _layer("onetrainer.config.x")


# The tiny package's shared files name fewer than three families: each family's tiny models, the inputs of its tiny
# step, its storage hooks and its configs' width fields live in its own tiny module (`onetrainer/tiny/registry.py`).
# A file is a family's own when it is named for a family module or key (`families/registry.py`), or begins with one
# (`qwen_tokenizer.py`). One pattern per family, matched without regard to case.
TINY_FAMILY_WORDS: dict[str, re.Pattern[str]] = {
    family: re.compile(pattern, re.IGNORECASE)
    for family, pattern in {
        "sd": r"(?<![a-z0-9])sd[12]\d*|stable[ _-]?diffusion(?![ _-]?(?:xl|3))",
        "sdxl": r"sdxl|stable[ _-]?diffusion[ _-]?xl",
        "pixart": r"pixart",
        "sd3": r"(?<![a-z0-9])sd3|stable[ _-]?diffusion[ _-]?3",
        "flux": r"flux",
        "chroma": r"chroma",
        "qwen": r"qwen",
        "zimage": r"z[ _-]?image",
        "sana": r"(?<![a-z0-9])sana(?![a-z])",
        "krea2": r"krea[ _-]?2",
        "anima": r"(?<![a-z])anima(?![a-z])",
        "lumina2": r"lumina",
        "ideogram4": r"ideogram",
        "hidream": r"hi[ _-]?dream",
        "wan": r"(?<![a-z0-9])wan(?:[ _-]?2\.?[12])?(?![a-z0-9])",
        "hunyuan_video": r"hunyuan[ _-]?video",
        "hunyuan_video15": r"hunyuan[ _-]?video[ _-]?1\.?5",
        "wuerstchen": r"w(?:ue|ü)rstchen",
        "cascade": r"cascade",
    }.items()
}
MOST_FAMILIES_IN_A_SHARED_TINY_FILE = 2


def _family_file_stems() -> set[str]:
    from onetrainer.families.registry import BUILT_IN_FAMILIES

    return set(BUILT_IN_FAMILIES) | {
        target.partition(":")[0].rpartition(".")[2] for target in BUILT_IN_FAMILIES.values()
    }


def _crowded_shared_files(folder: Path, family_stems: set[str]) -> list[str]:
    """The files of `folder` that belong to no one family and name more families than a shared file may."""
    crowded = []
    for path in sorted(folder.rglob("*.py")):
        if any(path.stem == stem or path.stem.startswith(f"{stem}_") for stem in family_stems):
            continue
        text = path.read_text(encoding="utf-8")
        named = sorted(family for family, words in TINY_FAMILY_WORDS.items() if words.search(text))
        if len(named) > MOST_FAMILIES_IN_A_SHARED_TINY_FILE:
            crowded.append(f"{path.relative_to(folder).as_posix()}: {', '.join(named)}")
    return crowded


def test_no_shared_tiny_file_names_three_families():
    crowded = _crowded_shared_files(PACKAGE / "tiny", _family_file_stems())
    assert not crowded, "move each family's part into its tiny module (tiny/registry.py):\n" + "\n".join(crowded)


def test_the_tiny_family_test_sees_a_switchboard(tmp_path):
    """The check above must be able to fail: a planted shared file naming three families is found, the same text in a
    family's own file or naming two families is not."""
    switchboard = "KINDS = ('StableDiffusionPipeline', 'FluxPipeline', 'PixArtAlphaPipeline')\n"
    (tmp_path / "switchboard.py").write_text(switchboard)
    (tmp_path / "flux.py").write_text(switchboard)
    (tmp_path / "flux_helpers.py").write_text(switchboard)
    (tmp_path / "pair.py").write_text("# Würstchen's and Stable Cascade's stage C\n")
    stems = _family_file_stems()
    assert _crowded_shared_files(tmp_path, stems) == ["switchboard.py: flux, pixart, sd"]
    assert {"sd", "sdxl", "flux", "chroma", "qwen", "cascade", "wuerstchen"} <= stems


# Words that name a family or one of its models (`config/` may say "flow matching", never "Flux").
MODEL_WORDS = re.compile(
    FAMILY_WORDS.pattern + r"|qwen|z[-_ ]?image|\bsd ?[123]|\bsd ?15|stable[-_ ]diffusion|\bchroma\b",
    re.IGNORECASE,
)


def config_lines_naming_a_model(package: Path) -> list[str]:
    """The lines of the config package, OneTrainer's enums aside, that name a family or a model."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "enums.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if MODEL_WORDS.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    return found


def test_the_config_names_no_family_outside_the_enums(tmp_path):
    """Each family declares its facts beside its module (`families/<module>_info.py`); the config's model-type table
    gathers them, and defaults that name a model (OneTrainer's default model type and base model) sit in the enums."""
    assert config_lines_naming_a_model(PACKAGE / "config") == []
    (tmp_path / "planted.py").write_text('HINT = "layers 7,8,9 for SD 3.5 Medium"\nOK = "flow matching"\n')
    (tmp_path / "enums.py").write_text('DEFAULT = "stable-diffusion-v1-5"\n')
    assert config_lines_naming_a_model(tmp_path) == ['planted.py:1: HINT = "layers 7,8,9 for SD 3.5 Medium"']
