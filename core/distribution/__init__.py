"""Models through OCI registries (a front door): push, pull, and the signed binding of manifest to model."""
