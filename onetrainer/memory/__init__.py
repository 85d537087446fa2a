"""The memory engine: what makes a large model fit a small device (layer offloading, for now)."""
