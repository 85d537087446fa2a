"""The training tab's "…" windows: optimizer parameters, custom scheduler, timestep distribution preview."""

from __future__ import annotations

import pytest

from onetrainer.config.enums import LearningRateScheduler, Optimizer, TimestepDistribution
from onetrainer.training import optim
from tests.gui.helpers import choose_in_menu, pump, view_of

pytestmark = pytest.mark.gui


def test_the_optimizer_dialog_lists_the_parameters_and_loads_defaults(app, screenshot) -> None:
    tab = app.select_tab("training")
    tab.form.button("optimizer.optimizer").invoke()
    dialog = tab.optimizer_dialog
    app.update()
    expected = optim.dialog_parameters(Optimizer.ADAMW)
    assert list(dialog.views) == [p.name for p in expected]
    assert dialog.views["beta1"].label.cget("text") == "Beta 1"
    assert dialog.views["beta1"].var.get() == ""  # None: the table's default, shown beside it
    dialog.views["beta1"].set_text("0.5")
    dialog.views["amsgrad"].switch.toggle()
    dialog.views["fused_back_pass"].switch.toggle()
    config = app.model.config
    assert (config.optimizer.beta1, config.optimizer.amsgrad, config.optimizer.fused_back_pass) == (0.5, True, True)
    screenshot(dialog, "optimizer-dialog")

    dialog.defaults_button.invoke()
    defaults = {p.name: p.default for p in expected}
    assert app.model.config.optimizer.beta1 == defaults["beta1"] and app.model.config.optimizer.amsgrad is False
    assert dialog.views["beta1"].var.get() == str(defaults["beta1"])
    assert dialog.views["amsgrad"].switch.get() == 0

    dialog.views["eps"].set_text("1e-6")
    dialog.close()  # remembers the settings of this optimizer
    assert not dialog.winfo_exists()
    assert app.model.config.optimizer_defaults["ADAMW"].eps == 1e-6


def test_switching_optimizers_remembers_each_ones_settings(app) -> None:
    menu = view_of(app, "training", "optimizer.optimizer").menu
    app.model.config.optimizer.weight_decay = 0.123
    choose_in_menu(menu, "PRODIGY")
    config = app.model.config
    assert config.optimizer.optimizer is Optimizer.PRODIGY
    assert config.optimizer.weight_decay == optim.table_defaults(Optimizer.PRODIGY).weight_decay
    dialog = app.select_tab("training").open_optimizer_dialog()
    assert list(dialog.views) == [p.name for p in optim.dialog_parameters(Optimizer.PRODIGY)]
    choose_in_menu(menu, "ADAMW")  # back: the earlier settings return, and the open dialog follows
    assert app.model.config.optimizer.weight_decay == 0.123
    assert list(dialog.views) == [p.name for p in optim.dialog_parameters(Optimizer.ADAMW)]
    assert dialog.views["weight_decay"].var.get() == "0.123"
    dialog.close()


def test_the_scheduler_dialog_edits_a_custom_scheduler(app) -> None:
    choose_in_menu(view_of(app, "training", "learning_rate_scheduler").menu, "CUSTOM")
    assert app.model.config.learning_rate_scheduler is LearningRateScheduler.CUSTOM
    tab = app.select_tab("training")
    tab.form.button("learning_rate_scheduler").invoke()
    dialog = tab.scheduler_dialog
    dialog.class_view.set_text("torch.optim.lr_scheduler.StepLR")
    dialog.parameters.add_button.invoke()
    dialog.parameters.view(0, "key").set_text("step_size")
    dialog.parameters.view(0, "value").set_text("%STEPS_PER_EPOCH%")
    config = app.model.config
    assert config.custom_learning_rate_scheduler == "torch.optim.lr_scheduler.StepLR"
    assert [(p.key, p.value) for p in config.scheduler_params] == [("step_size", "%STEPS_PER_EPOCH%")]
    dialog.parameters.button(0, "✕").invoke()
    assert config.scheduler_params == []
    dialog.close()


def test_the_timestep_window_draws_the_histogram_of_its_settings(app, screenshot) -> None:
    tab = app.select_tab("training")
    tab.form.button("timestep_distribution").invoke()
    window = tab.timestep_window
    pump(window, lambda: window.chart.bar_count == 100, timeout=90)  # the first draw imports torch
    uniform = list(window.counts)
    assert abs(max(uniform) - min(uniform)) < 0.3 * max(uniform)  # flat

    # Settings edited here show on the training tab too, and the histogram follows.
    window.form.view("max_noising_strength").set_text("0.5")
    assert app.model.config.max_noising_strength == 0.5
    assert view_of(app, "training", "max_noising_strength").var.get() == "0.5"
    pump(window, lambda: window.job is None and window.counts != uniform and window.chart.bar_count == 100, 60)
    assert sum(window.counts[60:]) == 0  # nothing above half the noise
    choose_in_menu(window.form.view("timestep_distribution").menu, "LOGIT_NORMAL")
    assert app.model.config.timestep_distribution is TimestepDistribution.LOGIT_NORMAL
    shaped = list(window.counts)
    pump(window, lambda: window.job is None and window.counts != shaped and window.chart.bar_count == 100, 60)
    # Round axis labels: timesteps in steps of 200, counts in steps of 1, 2 or 5 × 10^k.
    chart = window.chart
    x_ticks = [chart.itemcget(i, "text") for i in chart.find_withtag("x-tick")]
    assert x_ticks == ["0", "200", "400", "600", "800", "1000"]
    y_ticks = [float(chart.itemcget(i, "text").replace("k", "e3")) for i in chart.find_withtag("y-tick")]
    step = y_ticks[1]
    assert y_ticks == [i * step for i in range(len(y_ticks))] and f"{step:e}"[0] in "125"
    assert y_ticks[-1] >= max(window.counts) > y_ticks[-2]
    screenshot(window, "timestep-window")
    window.close()
    assert not window.winfo_exists()


def test_the_muon_dialog_edits_its_patterns_and_aux_adam_settings(app) -> None:
    menu = view_of(app, "training", "optimizer.optimizer").menu
    choose_in_menu(menu, "MUON")
    dialog = app.select_tab("training").open_optimizer_dialog()
    assert list(dialog.views) == [p.name for p in optim.dialog_parameters(Optimizer.MUON)]
    config = app.model.config
    dialog.views["muon_hidden_layers"].set_text("attn1, ff.net")
    assert config.optimizer.muon_hidden_layers == "attn1, ff.net"
    settings = dialog.views["muon_adam_config"]
    settings.set_text('{"beta1": 0.8, "weight_decay": 0.01}')
    assert settings.input_error is None, settings.input_error
    assert config.optimizer.muon_adam_config == {"beta1": 0.8, "weight_decay": 0.01}
    settings.set_text('{"beta1": 0.8,')  # not JSON (yet): marked, and not written
    assert settings.input_error and "not JSON" in settings.input_error
    assert app.model.input_errors()
    settings.set_text("[1, 2]")
    assert "not a JSON object" in settings.input_error
    settings.set_text("")  # empty: the defaults
    assert config.optimizer.muon_adam_config is None and settings.input_error is None
    dialog.close()


def test_every_offered_optimizer_is_in_the_menu_and_its_dialog_lists_its_parameters(app) -> None:
    from onetrainer.config.optimizer_config import OFFERED_OPTIMIZERS

    menu = view_of(app, "training", "optimizer.optimizer").menu
    dialog = app.select_tab("training").open_optimizer_dialog()
    for optimizer in OFFERED_OPTIMIZERS:
        choose_in_menu(menu, optimizer.value)
        assert app.model.config.optimizer.optimizer is optimizer
        assert list(dialog.views) == [p.name for p in optim.dialog_parameters(optimizer)], optimizer.value
    choose_in_menu(menu, "ADAMW")
    dialog.close()
