"""A signed tiny model whose bundle is filed in a directory store: what a webhook test reviews against."""

from __future__ import annotations

from pathlib import Path

from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier.attestations import store_bundle
from tests.conftest import write_tiny_model


def signed_model_store(root: Path, key_file: Path) -> tuple[str, Path]:
    """Sign a 1-shard tiny model in `root/model` with `key_file`; file its bundle in the store `root/store`.

    Returns:
        The model's root digest (hex) and the store directory.
    """
    model = write_tiny_model(root / "model", shards=1)
    result = sign_model(model, [load_private_key_file(key_file)])
    store = root / "store"
    store_bundle(store, (model / "model.sig").read_bytes())
    return result.root_digest, store
