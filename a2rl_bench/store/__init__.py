"""The results store: one DuckDB file safe for many processes (`results`), its schema (`schema`), and
ingesting a finished run directory into it (`ingest`)."""
