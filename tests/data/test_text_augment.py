"""Caption augmentation: each option's meaning, determinism, special tags from lists and files, placeholders."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from onetrainer.config.concept_config import ConceptTextConfig
from onetrainer.data.text_augment import (
    augment_caption,
    capitalize_tag,
    drop_probability,
    join_tags,
    read_special_tags,
    split_tags,
    validate_text_config,
)

CAPTION = "photo of sks, red hat, blue coat, smiling, outdoors, tree, cloudy sky, wooden bench"
TAGS = split_tags(CAPTION, ",")


def text(**changes) -> ConceptTextConfig:
    return ConceptTextConfig(**changes)


def run(config: ConceptTextConfig, seed: int = 0, caption: str = CAPTION) -> str:
    return augment_caption(caption, config, random.Random(seed))


def test_split_and_join_normalise_spacing_and_drop_empty_parts():
    assert split_tags(" a ,b,, c ,", ",") == ["a", "b", "c"]
    assert join_tags(["a", "b"], ",") == "a, b"
    assert join_tags(["a", "b"], "|") == "a| b"
    assert join_tags(["a", "b"], " ") == "a b"


def test_nothing_enabled_leaves_the_caption_as_written():
    caption = "a photo,of  a cat ,,"
    assert run(text(), caption=caption) == caption


def test_same_seed_same_caption_and_other_seeds_differ():
    config = text(enable_tag_shuffling=True, tag_dropout_enable=True, tag_dropout_mode="RANDOM")
    config.tag_dropout_probability = 0.3
    assert run(config, 7) == run(config, 7)
    assert len({run(config, seed) for seed in range(20)}) > 10


def test_shuffling_only_permutes_and_keeps_the_leading_tags_in_front():
    config = text(enable_tag_shuffling=True, keep_tags_count=2)
    results = [split_tags(run(config, seed), ",") for seed in range(30)]
    for tags in results:
        assert tags[:2] == TAGS[:2]
        assert sorted(tags) == sorted(TAGS)
    assert len({tuple(tags) for tags in results}) > 20


def test_keep_count_zero_shuffles_everything_and_a_large_count_nothing():
    assert {split_tags(run(text(enable_tag_shuffling=True, keep_tags_count=0), s), ",")[0] for s in range(40)} != {
        TAGS[0]
    }
    assert run(text(enable_tag_shuffling=True, keep_tags_count=100)) == ", ".join(TAGS)


def test_full_dropout_cuts_the_caption_back_to_the_kept_tags_with_the_probability():
    always = text(tag_dropout_enable=True, tag_dropout_mode="FULL", tag_dropout_probability=1.0, keep_tags_count=2)
    assert run(always) == "photo of sks, red hat"
    half = text(tag_dropout_enable=True, tag_dropout_mode="FULL", tag_dropout_probability=0.5, keep_tags_count=1)
    outcomes = Counter(run(half, seed) for seed in range(400))
    # All or nothing: either the whole caption or only the kept tag.
    assert set(outcomes) == {"photo of sks", ", ".join(TAGS)}
    assert 150 < outcomes["photo of sks"] < 250


def test_random_dropout_drops_each_tag_with_the_probability():
    config = text(tag_dropout_enable=True, tag_dropout_mode="RANDOM", tag_dropout_probability=0.25, keep_tags_count=1)
    kept = Counter()
    draws = 600
    for seed in range(draws):
        tags = split_tags(run(config, seed), ",")
        assert tags[0] == TAGS[0]
        assert [t for t in TAGS if t in tags] == tags  # order preserved, nothing invented
        kept.update(tags[1:])
    for tag in TAGS[1:]:
        assert 0.65 < kept[tag] / draws < 0.85


def test_random_weighted_drops_later_tags_more_often():
    assert drop_probability("RANDOM WEIGHTED", 0.8, 0, 4) == pytest.approx(0.2)
    assert drop_probability("RANDOM WEIGHTED", 0.8, 3, 4) == pytest.approx(0.8)
    config = text(
        tag_dropout_enable=True, tag_dropout_mode="RANDOM WEIGHTED", tag_dropout_probability=0.8, keep_tags_count=1
    )
    dropped = Counter()
    draws = 800
    for seed in range(draws):
        dropped.update(set(TAGS) - set(split_tags(run(config, seed), ",")))
    rates = [dropped[tag] / draws for tag in TAGS[1:]]
    assert dropped[TAGS[0]] == 0
    assert rates[0] < 0.2 and rates[-1] > 0.7
    assert rates[0] < rates[3] < rates[-1]


def test_whitelisted_tags_are_never_dropped():
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="FULL",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="WHITELIST",
        tag_dropout_special_tags="Smiling, tree",
    )
    assert run(config) == "photo of sks, smiling, tree"


def test_blacklisted_tags_are_the_only_ones_dropped():
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="RANDOM",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="BLACKLIST",
        tag_dropout_special_tags="red hat,blue coat",
    )
    assert split_tags(run(config), ",") == [t for t in TAGS if t not in ("red hat", "blue coat")]


def test_regex_special_tags_match_the_whole_tag():
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="FULL",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="WHITELIST",
        tag_dropout_special_tags_regex=True,
        tag_dropout_special_tags=r"\w+ (hat|coat)|tre",
    )
    # "tre" must match the whole tag, so "tree" is not protected.
    assert run(config) == "photo of sks, red hat, blue coat"


def test_weighted_tags_in_parentheses_count_as_the_plain_tag():
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="FULL",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="WHITELIST",
        tag_dropout_special_tags="masterpiece",
    )
    assert run(config, caption="sks, (masterpiece), tree") == "sks, (masterpiece)"


def test_special_tags_from_a_txt_file_one_per_line_or_delimited(tmp_path):
    path = tmp_path / "keep.txt"
    path.write_text("smiling\ntree, cloudy sky\n\n", encoding="utf-8")
    assert read_special_tags(str(path), ",") == ("smiling", "tree", "cloudy sky")
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="FULL",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="WHITELIST",
        tag_dropout_special_tags=str(path),
    )
    assert run(config) == "photo of sks, smiling, tree, cloudy sky"


def test_special_tags_from_a_csv_file_use_the_first_column(tmp_path):
    path = tmp_path / "tags.csv"
    path.write_text('outdoors,123\n"red hat",45\n', encoding="utf-8")
    assert read_special_tags(str(path), ",") == ("outdoors", "red hat")
    config = text(
        tag_dropout_enable=True,
        tag_dropout_mode="FULL",
        tag_dropout_probability=1.0,
        tag_dropout_special_tags_mode="BLACKLIST",
        tag_dropout_special_tags=str(path),
    )
    assert split_tags(run(config), ",") == [t for t in TAGS if t not in ("outdoors", "red hat")]


def test_an_edited_special_tags_file_is_read_again(tmp_path):
    path = tmp_path / "keep.txt"
    path.write_text("a\n", encoding="utf-8")
    assert read_special_tags(str(path), ",") == ("a",)
    path.write_text("a\nbb\n", encoding="utf-8")
    assert read_special_tags(str(path), ",") == ("a", "bb")


def test_a_missing_special_tags_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.txt"
    config = text(
        tag_dropout_enable=True,
        tag_dropout_probability=0.5,
        tag_dropout_special_tags_mode="WHITELIST",
        tag_dropout_special_tags=str(missing),
    )
    with pytest.raises(ValueError, match=r"nope\.txt"):
        validate_text_config(config)
    with pytest.raises(ValueError, match=r"nope\.txt"):
        run(config)


def test_an_invalid_regex_is_an_error_naming_it():
    config = text(
        tag_dropout_enable=True,
        tag_dropout_probability=0.5,
        tag_dropout_special_tags_mode="BLACKLIST",
        tag_dropout_special_tags_regex=True,
        tag_dropout_special_tags="ok, bad(",
    )
    with pytest.raises(ValueError, match=r"bad\("):
        validate_text_config(config)


def test_unknown_caps_mode_is_an_error():
    with pytest.raises(ValueError, match="shout"):
        validate_text_config(text(caps_randomize_enable=True, caps_randomize_mode="capslock, shout"))


def test_capitalization_modes():
    rng = random.Random(0)
    assert capitalize_tag("red hat", "capslock", rng) == "RED HAT"
    assert capitalize_tag("red HAT", "title", rng) == "Red Hat"
    assert capitalize_tag("red HAT", "first", rng) == "Red hat"
    mixed = capitalize_tag("a" * 40, "random", rng)
    assert mixed.lower() == "a" * 40 and mixed != mixed.lower() and mixed != mixed.upper()


def test_each_tag_gets_one_listed_mode_with_the_probability():
    config = text(caps_randomize_enable=True, caps_randomize_probability=1.0, caps_randomize_mode="capslock")
    assert run(config) == ", ".join(t.upper() for t in TAGS)
    config = text(caps_randomize_enable=True, caps_randomize_probability=0.5, caps_randomize_mode="capslock")
    upper = Counter()
    for seed in range(200):
        upper.update(t for t in split_tags(run(config, seed), ",") if t.isupper())
    assert all(60 < upper[t.upper()] < 140 for t in TAGS)


def test_lowercase_applies_first_and_even_without_randomization():
    assert run(text(caps_randomize_lowercase=True), caption="Photo, RED Hat") == "photo, red hat"
    config = text(
        caps_randomize_enable=True,
        caps_randomize_probability=1.0,
        caps_randomize_mode="first",
        caps_randomize_lowercase=True,
    )
    assert run(config, caption="PHOTO OF X, RED HAT") == "Photo of x, Red hat"


@pytest.mark.parametrize("mode", ["capslock", "title", "first", "random"])
def test_placeholders_keep_their_case(mode):
    config = text(
        caps_randomize_enable=True,
        caps_randomize_probability=1.0,
        caps_randomize_mode=mode,
        caps_randomize_lowercase=True,
    )
    for seed in range(10):
        result = run(config, seed, caption="a Photo of <MyEmbedding>, <sks> dog, Red <x-Y_z>hat")
        assert "<MyEmbedding>" in result and "<sks>" in result and "<x-Y_z>" in result


def test_turning_one_step_on_does_not_change_what_another_does():
    shuffle = text(enable_tag_shuffling=True)
    both = text(enable_tag_shuffling=True, caps_randomize_enable=True, caps_randomize_probability=1.0)
    both.caps_randomize_mode = "capslock"
    for seed in range(5):
        assert run(both, seed) == run(shuffle, seed).upper()
