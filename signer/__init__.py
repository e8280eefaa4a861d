"""modelsec.signer."""
