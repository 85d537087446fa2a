"""scripts/benchmark.py: the measurements run and report their figures (no speed is asserted: that is the docs' job)."""

from __future__ import annotations

import json

import pytest
import torch

from onetrainer.benchmark.cli import format_caching, format_overhead, main
from onetrainer.benchmark.gpu import CASES, format_gpu, unet_lora_benchmark
from onetrainer.benchmark.overhead import BARE, OURS, VARIANTS, compare_overhead, prepare
from tests.helpers import local_config

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """As the benchmark itself runs: on a busy 2-core machine two threads per process spin and crawl."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_overhead_times_ours_and_the_bare_loop_and_computes_the_ratio(tmp_path):
    result = compare_overhead(steps=2, warmup=1, repeat=1, workdir=tmp_path, device=CPU, memory=False, progress=None)

    assert set(result.runs) == set(VARIANTS)
    for variant in VARIANTS:
        (run,) = result.runs[variant]
        assert run.steps == 2 and run.seconds > 0
        assert result.median_rate(variant) > 0
    assert result.ratio(BARE) == pytest.approx(result.median_rate(OURS) / result.median_rate(BARE))
    figures = json.loads(json.dumps(result.to_dict()))  # everything the --json file holds is plain JSON
    assert figures["ratio_ours_over_bare"] == pytest.approx(result.ratio(BARE))
    assert figures["settings"]["batch_size"] == 2 and figures["settings"]["resolution"] == "64"
    table = format_overhead(result)
    assert "ratio ours / bare:" in table and "goal >= 0.95" in table
    # Each step's CPU time too: on a shared CPU machine the ratio that other processes' load barely moves.
    assert all(len(r.cpu_seconds) == 2 and r.cpu_steps_per_second > 0 for runs in result.runs.values() for r in runs)
    assert figures["ratio_ours_over_bare_cpu_time"] == pytest.approx(result.cpu_ratio(BARE))
    assert "ratio from the process's CPU time per step" in table


def test_the_epoch_case_tells_the_steps_that_begin_an_epoch_from_the_others():
    from onetrainer.benchmark.epochs import format_epoch_boundaries, time_epoch_boundaries

    # 4 images at batch 2: 2 steps an epoch, so of the timed steps 2-11 the odd ones begin one.
    [case] = time_epoch_boundaries(steps=10, warmup=1, image_counts=(4,), workers=0, device=CPU, progress=None)
    assert case.run.first_of_epoch == (False, True) * 5 and case.boundaries == 5
    assert case.boundary_seconds() is not None and case.boundary_share() is not None
    assert "of a step (goal < 5%" in format_epoch_boundaries([case])
    assert json.loads(json.dumps(case.to_dict()))["epoch_boundaries"] == 5


def test_the_bare_loop_trains_the_same_lora_as_our_method(tmp_path):
    """Same maths needs the same adapters: the bare loop's trained parameter count equals our LoRA method's."""
    from onetrainer.benchmark.overhead import run_bare
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    setup = prepare(tmp_path, CPU)
    family = load_family_class(setup.config.model_type)()
    model = family.load(local_config(setup.config))
    method = create_method(setup.config, family, model, CPU)
    ours = sum(p.numel() for group in method.param_groups() for p in group["params"])

    _, bare = run_bare(setup, steps=1, warmup=1)
    assert bare == ours > 0


@pytest.mark.parametrize(("case", "float8"), [("sd15", False), ("sdxl", True)])
def test_the_gpu_benchmark_code_runs_on_a_cpu_with_a_tiny_unet(case, float8):
    from onetrainer.tiny import tiny_model_dir

    unet_config = json.loads((tiny_model_dir(case) / "unet" / "config.json").read_text(encoding="utf-8"))
    run = unet_lora_benchmark(
        case, CPU, steps=1, warmup=1, unet_config=unet_config, resolution=64, weight_dtype=torch.float32,
        optimizer="adamw", float8_weights=float8,
    )  # fmt: skip
    assert run.weight_dtype == ("float8_e4m3fn (float32 compute)" if float8 else "float32")
    assert run.steps_per_second > 0
    assert run.lora_targets > 0 and run.trained_parameters > 0
    assert run.peak_allocated_bytes is None and not run.goal_met  # nothing measured on a CPU meets a VRAM goal
    assert run.goal_peak_bytes == CASES[case].goal_peak_bytes
    table = format_gpu(run)
    assert "it/s" in table and CASES[case].label in table and json.dumps(run.to_dict())


def test_caching_reports_throughput_and_a_fully_cached_second_start(tmp_path):
    from onetrainer.benchmark.caching import measure_caching

    result = measure_caching(count=6, workdir=tmp_path, device=CPU)
    assert result.cold.latents_needed == result.cold.latents_encoded >= 6  # every image, some in two variations
    assert result.cold.captions_encoded >= 6 and result.cold.images_per_second > 0
    assert result.warm.latents_encoded == 0 and result.warm.captions_encoded == 0  # the second start encodes nothing
    assert result.warm.latents_needed == result.cold.latents_needed
    assert result.cold.seconds_to_first_step > 0 and result.warm.seconds_to_first_step > 0
    figures = json.loads(json.dumps(result.to_dict()))
    assert figures["caching_images_per_second"] == pytest.approx(result.cold.images_per_second)
    assert "images/s" in format_caching(result) and "fully cached" in format_caching(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")
def test_without_cuda_the_gpu_part_says_not_measured(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "gpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("not measured: no CUDA device") == 2 and "SDXL-size" in printed
    figures = json.loads(out.read_text(encoding="utf-8"))
    assert figures["gpu"] == {"sd15": None, "sdxl": None} and figures["process_peak_rss_bytes"] > 0


def test_the_gui_part_is_handed_in_and_fails_the_run_when_asked_for_and_impossible(capsys):
    asked = []

    def gui_part(required: bool, busy: int):
        asked.append((required, busy))
        return False

    assert main(["--gui", "--busy", "2"], gui_part=gui_part) == 1 and asked == [(True, 2)]
    assert main(["--part", "gui"]) == 1  # without the GUI handed in, the part cannot run
    assert "not measured" in capsys.readouterr().out


def test_invalid_counts_are_refused(capsys):
    assert main(["--steps", "0"]) == 2
    assert "at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_the_memory_probe_reports_the_peak_of_a_process_of_its_own():
    from onetrainer.benchmark.overhead import probe_variant_memory

    figures = probe_variant_memory(BARE, steps=1, warmup=1)
    assert figures["peak_rss_bytes"] >= figures["baseline_rss_bytes"] > 0


def test_the_tiny_part_times_every_tiny_denoiser_step(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "tiny", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["tiny"]
    assert set(figures) == {"sd15", "sd21", "sdxl", "pixart", "wuerstchen", "cascade"}
    for variant, figure in figures.items():
        assert len(figure["seconds"]) == 3 and figure["best_seconds"] == min(figure["seconds"]) > 0, variant
    assert "cascade" in capsys.readouterr().out


def test_the_split_part_times_a_tiny_step_whole_and_split(tmp_path, capsys, monkeypatch):
    from onetrainer.benchmark import model_split

    monkeypatch.setattr(model_split, "VARIANTS", ("pixart",))
    out = tmp_path / "figures.json"
    assert main(["--part", "split", "--repeat", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["split"]
    assert "pixart cpu,cpu" in figures
    figure = figures["pixart cpu,cpu"]
    assert figure["blocks"] >= 2 and figure["whole_ms"] > 0 and figure["split_ms"] > 0
    assert figure["ratio"] == figure["split_ms"] / figure["whole_ms"]
    assert "pixart cpu,cpu" in capsys.readouterr().out


def test_the_pixart_part_times_ours_and_the_bare_loop(capsys):
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("pixart", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


@pytest.mark.slow
def test_the_ddp_part_times_one_and_two_processes(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "ddp", "--steps", "2", "--warmup", "1", "--batch-size", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["ddp"]
    one, two = figures["runs"]
    assert (one["processes"], two["processes"]) == (1, 2) and one["batch_per_process"] == two["batch_per_process"] == 1
    assert one["images_per_second"] > 0 and two["images_per_second"] > 0
    assert figures["speedup"] == pytest.approx(two["images_per_second"] / one["images_per_second"])
    assert "2 processes:" in capsys.readouterr().out


def test_the_ddp_part_needs_two_processes(capsys):
    assert main(["--part", "ddp", "--processes", "1"]) == 2
    assert "--processes at least 2" in capsys.readouterr().err


def test_the_cascade_part_times_ours_and_the_bare_loop():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("cascade", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_sana_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("sana", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_krea2_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("krea2", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_lumina2_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("lumina2", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_ideogram4_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("ideogram4", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")
def test_without_cuda_the_memory_engines_full_size_cases_say_not_measured():
    from onetrainer.benchmark.memory_engine import FLUX_CASES, run_memory_gpu_part

    printed = []
    figures = run_memory_gpu_part(steps=1, warmup=1, progress=printed.append)
    assert list(figures) == [c.key for c in FLUX_CASES] + ["sdxl-FLOAT_8-1024"]
    assert all(v is None for v in figures.values()) and all("not measured" in line for line in printed)
    assert "flux-FLOAT_8-512-offload0.7" in figures and "flux-FLOAT_8-1024-offload0.7-inline" in figures


def test_gguf_weights_are_timed_against_the_plain_run():
    from onetrainer.benchmark.memory_engine import compare_gguf, format_gguf

    figures = compare_gguf(steps=1, warmup=1, repeat=1, kinds=("Q4_0",), progress=None)
    assert set(figures["runs"]) == {"plain", "Q4_0"} and figures["runs"]["plain"]["ratio"] == 1.0
    assert figures["runs"]["Q4_0"]["steps_per_second"] > 0
    assert "GGUF Q4_0:" in format_gguf(figures)


def test_the_offload_part_times_each_fraction_against_the_plain_run():
    from onetrainer.benchmark.offload import compare_offload, format_offload

    figures = compare_offload(steps=1, warmup=1, repeat=1, fractions=(0.5,), progress=None)
    assert set(figures["runs"]) == {"0", "0.5"}
    plain, offloaded = figures["runs"]["0"], figures["runs"]["0.5"]
    assert plain["steps_per_second"] > 0 and offloaded["steps_per_second"] > 0 and plain["ratio"] == 1.0
    assert offloaded["ratio"] == pytest.approx(offloaded["steps_per_second"] / plain["steps_per_second"])
    assert "offload 0.5:" in format_offload(figures)


def test_the_calls_part_counts_each_loops_python_calls_per_step(monkeypatch):
    """The per-step count is the difference of two runs' counts over their step difference: set-up calls cancel."""
    from onetrainer.benchmark import overhead, step_calls
    from onetrainer.util.layer_filter import name_matches

    def loop(per_step: int):
        def run(_setup, steps, _warmup, **_names):
            for _ in range(7):  # set-up: the same in every run, whatever its length
                name_matches("a", ["a"], False)
            for _ in range(steps * per_step):
                name_matches("a", ["b"], False)
                json.dumps({})

        return run

    monkeypatch.setattr(overhead, "prepare", lambda *_args: None)
    monkeypatch.setattr(overhead, "run_ours", loop(5))
    monkeypatch.setattr(overhead, "run_bare", loop(2))
    counts = step_calls.count_step_calls(short=2, long=6)
    # Per step, 5 and 2 rounds of the same calls (each round's count is the calls' frames, generators included).
    for package in ("onetrainer", "other"):
        assert 2 * counts["ours"][package] == 5 * counts["bare"][package] > 0
    assert counts["bare"]["onetrainer"] == 2 * 3  # name_matches and the two resumes of its generator
    assert counts["ours"]["total"] == sum(v for k, v in counts["ours"].items() if k != "total")
    table = step_calls.format_step_calls(counts).splitlines()
    assert table[1].startswith("ours") and table[2].startswith("bare") and "onetrainer" in table[0]


def test_the_flux_part_compares_ours_with_the_bare_loop_and_reports_the_gpu_step(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "flux", "--steps", "2", "--warmup", "1", "--repeat", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["flux"]
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])
    assert figures["trained_parameters"] > 0  # checked equal to our method's count, or the part would have failed
    assert figures["cpu_ratio"] > 0
    printed = capsys.readouterr().out
    assert "tiny FLUX.1-dev" in printed and "LoRA parameters" in printed
    if not torch.cuda.is_available():
        assert figures["gpu"] == {"BFLOAT_16": None, "FLOAT_8": None}
        assert printed.count("not measured: no CUDA device") == 2


def test_the_bare_flux_loop_draws_sigma_as_our_flow_matching_schedule():
    """Logit-normal σ on the T training steps, shifted by timestep_shift: the same distribution as our schedule's."""
    from onetrainer.benchmark.family_overhead import sample_sigmas
    from onetrainer.config import config_from_dict
    from onetrainer.noise.flow_matching import FlowMatchingSchedule
    from onetrainer.training.settings import timestep_settings

    schedule = FlowMatchingSchedule({"num_train_timesteps": 1000}, patch_size=2)
    for shift in (1.0, 3.0):
        config, _ = config_from_dict({"timestep_distribution": "LOGIT_NORMAL", "timestep_shift": shift})
        torch.manual_seed(0)
        bare = sample_sigmas(20000, config, 1000, CPU)
        ours = schedule.sample_times(20000, torch.Generator().manual_seed(1), timestep_settings(config), CPU)
        assert bare.min() >= 1e-3 and bare.max() <= 1.0
        assert torch.allclose(bare * 1000, (bare * 1000).round())  # on the training steps
        quantiles = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9])
        assert torch.allclose(bare.quantile(quantiles), ours.quantile(quantiles), atol=0.01)


@pytest.mark.parametrize(("weight_dtype", "offload"), [("BFLOAT_16", 0.0), ("FLOAT_8", 0.0), ("INT_W8A8", 0.5)])
def test_the_flux_gpu_benchmark_code_runs_on_a_cpu_with_a_tiny_transformer(weight_dtype, offload):
    from onetrainer.benchmark.flux_gpu import flux_lora_benchmark, format_flux_gpu
    from onetrainer.tiny import tiny_model_dir

    config = json.loads((tiny_model_dir("flux-dev") / "transformer" / "config.json").read_text(encoding="utf-8"))
    run = flux_lora_benchmark(
        CPU, steps=1, warmup=1, transformer_config=config, resolution=64, text_tokens=32, weight_dtype=weight_dtype,
        optimizer="adamw", offload_fraction=offload,
    )  # fmt: skip
    assert run.steps_per_second > 0 and run.losses_finite
    assert run.blocks == 4 and run.offloaded_blocks == (2 if offload else 0)
    assert ("2 of 4 blocks offloaded" in format_flux_gpu(run)) == bool(offload)
    assert run.image_tokens == 16 and run.compute_dtype == "bfloat16"
    assert run.lora_targets > 0 and run.trained_parameters > 0
    assert run.peak_allocated_bytes is None  # nothing measured off CUDA
    if weight_dtype != "BFLOAT_16":  # the linear weights in one byte; norms, embeddings' biases and the rest bfloat16
        assert run.base_parameters < run.weights_bytes < 2 * run.base_parameters
    else:
        assert run.weights_bytes == 2 * run.base_parameters
    assert "it/s" in format_flux_gpu(run) and json.dumps(run.to_dict())


def test_the_flux_gpu_benchmark_fine_tunes_with_the_fused_back_pass_and_trained_blocks_offloaded():
    from onetrainer.benchmark.flux_gpu import flux_lora_benchmark, format_flux_gpu
    from onetrainer.tiny import tiny_model_dir

    config = json.loads((tiny_model_dir("flux-dev") / "transformer" / "config.json").read_text(encoding="utf-8"))
    run = flux_lora_benchmark(
        CPU, steps=1, warmup=1, transformer_config=config, resolution=64, text_tokens=32, method="FINE_TUNE",
        fused_back_pass=True, offload_fraction=0.5,
    )  # fmt: skip
    assert run.losses_finite and run.optimizer == "Adafactor" and run.lora_targets == 0
    assert run.trained_parameters == run.base_parameters and run.offloaded_blocks == 2
    assert run.offload_host_bytes > 0  # the trained blocks' weights moved out too (a LoRA's frozen ones only)
    text = format_flux_gpu(run)
    assert "fine-tune" in text and "the whole transformer trained, fused back pass" in text


def test_the_sd3_part_compares_ours_with_the_bare_loop(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "sd3", "--steps", "2", "--warmup", "1", "--repeat", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["sd3"]
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])
    assert figures["trained_parameters"] > 0  # checked equal to our method's count, or the part would have failed
    assert "tiny SD 3.5 Medium" in capsys.readouterr().out


def test_the_qwen_part_compares_ours_with_the_bare_loop(tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert main(["--part", "qwen", "--steps", "2", "--warmup", "1", "--repeat", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text(encoding="utf-8"))["qwen"]
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["trained_parameters"] > 0  # checked equal to our method's count, or the part would have failed
    assert "tiny Qwen-Image" in capsys.readouterr().out


def test_the_flux2_part_times_ours_and_the_bare_loop_on_as_many_adapters():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("flux2", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_ernie_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("ernie", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])


def test_the_anima_part_times_ours_and_the_bare_loop_training_the_same_lora():
    from onetrainer.benchmark.family_overhead import compare_family

    figures = compare_family("anima", steps=1, warmup=1, repeat=1, progress=None)
    assert figures["ours_steps_per_second"] > 0 and figures["bare_steps_per_second"] > 0
    assert figures["ratio"] == pytest.approx(figures["ours_steps_per_second"] / figures["bare_steps_per_second"])
