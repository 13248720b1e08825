"""Reports: a run's figures, README's tables rendered from the records, uploads of offline runs."""
