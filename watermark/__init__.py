"""modelsec.watermark."""
