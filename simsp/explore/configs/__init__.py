"""What to simulate: every scenario field once (fields), a Config and the grid of comma lists
(grid), sweep files of named variants (sweep_file), GPUs as an axis (world), and the `simsp run`
line that reproduces one configuration (run_line)."""
