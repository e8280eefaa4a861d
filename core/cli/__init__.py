"""The `modelsec` command line: one module per command group over `common` (shared options, replies)."""
