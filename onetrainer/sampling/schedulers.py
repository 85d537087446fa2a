"""The sampler choices (`noise_scheduler`) as diffusers schedulers built from the model's own scheduler config."""

from __future__ import annotations

from onetrainer.config.enums import NoiseScheduler
from onetrainer.util.threads import library_attribute

# (diffusers class name, extra config) per sampler. The SDE variant uses DPM-Solver++'s own SDE algorithm, which
# needs no extra package.
_SAMPLERS: dict[NoiseScheduler, tuple[str, dict]] = {
    NoiseScheduler.DDIM: ("DDIMScheduler", {}),
    NoiseScheduler.EULER: ("EulerDiscreteScheduler", {}),
    NoiseScheduler.EULER_A: ("EulerAncestralDiscreteScheduler", {}),
    NoiseScheduler.DPMPP: ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++"}),
    NoiseScheduler.DPMPP_SDE: ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++"}),
    NoiseScheduler.UNIPC: ("UniPCMultistepScheduler", {}),
    NoiseScheduler.EULER_KARRAS: ("EulerDiscreteScheduler", {"use_karras_sigmas": True}),
    NoiseScheduler.DPMPP_KARRAS: (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "dpmsolver++", "use_karras_sigmas": True},
    ),
    NoiseScheduler.DPMPP_SDE_KARRAS: (
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "sde-dpmsolver++", "use_karras_sigmas": True},
    ),
    NoiseScheduler.UNIPC_KARRAS: ("UniPCMultistepScheduler", {"use_karras_sigmas": True}),
}


def create_sampler(kind: NoiseScheduler, base_config, zero_terminal_snr: bool = False):
    """A sampling scheduler of `kind` with the model's betas and prediction type."""

    class_name, extra = _SAMPLERS[kind]
    overrides = dict(extra)
    if zero_terminal_snr:
        overrides.update(rescale_betas_zero_snr=True, timestep_spacing="trailing")
    cls = library_attribute("diffusers", class_name)
    return cls.from_config(base_config, **overrides)
