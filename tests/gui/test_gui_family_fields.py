"""Family-specific fields in a real Tk window: switching the model type shows a family's own fields and hides the
others' (PixArt's VB loss, Würstchen's and Cascade's effnet encoder and decoder parts)."""

from __future__ import annotations

import pytest

from gui.labels import NOT_TRAINABLE_SUFFIX, model_type_label
from onetrainer.config.enums import ModelType
from onetrainer.config.model_types import MODEL_TYPES
from tests.gui.helpers import choose_in_menu

pytestmark = pytest.mark.gui

PRIOR_PARTS = (
    "prior.weight_dtype", "prior.model_name", "effnet_encoder.model_name", "effnet_encoder.weight_dtype",
    "decoder.model_name",
)  # fmt: skip


def shown(app, tab: str, path: str) -> bool:
    view = app.select_tab(tab).form.view(path)
    return view is not None and view.visible


def test_pixart_shows_vb_loss_and_no_prior_parts(app) -> None:
    app.topbar.choose_model_type(ModelType.PIXART_ALPHA)
    assert shown(app, "training", "vb_loss_strength") and shown(app, "model", "transformer.weight_dtype")
    assert shown(app, "model", "transformer.model_name")  # an original PixArt checkpoint over the base
    assert not any(shown(app, "model", path) for path in PRIOR_PARTS)


def test_sd3_offers_to_leave_t5_out_and_no_other_part_or_family_does(app) -> None:
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_35)
    assert shown(app, "model", "text_encoder_3.include")
    assert not shown(app, "model", "text_encoder.include") and not shown(app, "model", "transformer.include")
    app.topbar.choose_model_type(ModelType.FLUX_DEV_1)
    assert not shown(app, "model", "text_encoder_2.include")
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)


@pytest.mark.parametrize("model_type", [ModelType.WUERSTCHEN_2, ModelType.STABLE_CASCADE_1])
def test_prior_families_show_effnet_and_decoder_parts_only_for_themselves(app, model_type) -> None:
    app.topbar.choose_model_type(model_type)
    assert all(shown(app, "model", path) for path in (*PRIOR_PARTS, "decoder_vqgan.weight_dtype"))
    assert not shown(app, "training", "vb_loss_strength")
    assert not shown(app, "model", "transformer.weight_dtype") and not shown(app, "model", "unet.weight_dtype")
    # Würstchen's decoder has its own text encoder; Cascade's decoder shares the prior's.
    assert shown(app, "model", "decoder_text_encoder.weight_dtype") == (model_type is ModelType.WUERSTCHEN_2)
    for other in (ModelType.STABLE_DIFFUSION_15, ModelType.STABLE_DIFFUSION_XL_10_BASE, ModelType.PIXART_ALPHA):
        app.topbar.choose_model_type(other)
        assert not any(shown(app, "model", path) for path in PRIOR_PARTS), other
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)


def test_model_type_menu_follows_the_family_registry(app, monkeypatch) -> None:
    # Once the Würstchen and Cascade families are registered, the menu no longer marks them "not trainable yet" and
    # picking their plain label selects them (the window was built before they were registered).
    from onetrainer import families

    monkeypatch.setitem(families.FAMILY_CLASSES, "wuerstchen", "never.loaded:Wuerstchen")
    monkeypatch.setitem(families.FAMILY_CLASSES, "cascade", "never.loaded:Cascade")
    app.topbar.refresh()
    values = app.topbar.model_type_menu.cget("values")
    for model_type in (ModelType.WUERSTCHEN_2, ModelType.STABLE_CASCADE_1, ModelType.PIXART_ALPHA):
        label = model_type_label(model_type)
        assert label == MODEL_TYPES[model_type].label and label in values
        assert label + NOT_TRAINABLE_SUFFIX not in values
    choose_in_menu(app.topbar.model_type_menu, model_type_label(ModelType.STABLE_CASCADE_1))
    assert app.model.config.model_type is ModelType.STABLE_CASCADE_1
    assert app.topbar.model_type_menu.get() == MODEL_TYPES[ModelType.STABLE_CASCADE_1].label
    monkeypatch.undo()
    app.topbar.refresh()  # back to the real registry for the next tests
    assert model_type_label(ModelType.STABLE_CASCADE_1) in app.topbar.model_type_menu.cget("values")


def test_onetrainers_cascade_preset_says_where_to_get_the_effnet_file(app) -> None:
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import MODEL_TYPES

    EFFNET_DOWNLOAD = MODEL_TYPES[ModelType.STABLE_CASCADE_1].family.part_downloads["effnet_encoder"]
    from tests.conftest import onetrainer_presets_dir

    assert app.load_config_file(onetrainer_presets_dir() / "Stable Cascade" / "#stable cascade.json")
    assert app.model.config.model_type is ModelType.STABLE_CASCADE_1
    status = app.footer.status
    assert "effnet_encoder.safetensors" in status and EFFNET_DOWNLOAD in status and app.footer.status_level == "warning"
    assert shown(app, "model", "effnet_encoder.model_name")
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)
