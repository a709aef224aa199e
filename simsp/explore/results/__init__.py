"""The results of an exploration: the table in configuration order (table), what fits in
memory less the reserve (headroom), and the folder each exploration owns (folders)."""
