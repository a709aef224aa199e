"""What `simsp search` can rank by (kept apart so the command line loads without pandas)."""

OBJECTIVES = ("time", "tokens-per-s", "mfu", "memory")
