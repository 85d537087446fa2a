"""Training on another machine over SSH (OneTrainer's `cloud` block): `run.run_remote` is the local half,
`agent` the half on the host, `connection` the SSH link, `settings` the cloud block and the secrets file,
`providers` where the host comes from (a LINUX machine, a RunPod pod)."""
