"""Developer tools that are neither tests nor benchmarks; run each as `python -m tools.NAME` from the repository
root (make_screenshots: the README's and docs' screenshots, offscreen)."""
