"""modelsec.robustness."""
