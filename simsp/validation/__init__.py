"""`simsp validate`: measurement files, the metrics simsp can reproduce, and the comparison."""
