"""The noise process a model trains on, below the families and the trainer: what the denoiser predicts
(`prediction`), the schedules that noise latents (`schedule` the interface, `discrete` the DDPM tables, `cosine` the
continuous improved-DDPM cosine, `flow_matching` rectified flow with its resolution-dependent shift), the timestep
distributions (`timesteps`), the noise draws (`draws`), the
per-pixel losses (`losses`), the loss weighting by noise level (`weighting`) and IDDPM's variational bound for
learned-variance outputs (`variational_bound`).

Layering: this package imports only `onetrainer.config.enums`, `onetrainer.util` and (inside functions)
`onetrainer.sampling.schedulers`; families and the trainer import it, never the other way round. It never reads the
config: what it needs of the settings comes as small frozen objects (`timesteps.TimestepSettings`,
`draws.DrawSettings`, `losses.LossSettings`) that the trainer builds once per run (`training/settings.py`).
"""
