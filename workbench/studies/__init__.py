"""Studies built on runs: injection campaigns and per-bit sensitivity."""
