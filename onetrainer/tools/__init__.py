"""The tools tab's library: automatic masks, automatic captions and model conversion (no GUI imports)."""
