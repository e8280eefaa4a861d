"""modelsec.attestations."""
