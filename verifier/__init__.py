"""modelsec.verifier."""
