"""Generated gRPC stubs for the modelsec.v1 API (see proto/modelsec/v1/*.proto)."""
