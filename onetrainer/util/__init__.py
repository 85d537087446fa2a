"""Generic utilities (files, the hub, threads, images, library chatter, layer names): they import nothing of the
config or any other package of onetrainer, which may all use them."""
