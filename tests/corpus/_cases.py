"""Materialise acceptance cases from ../shared/corpus into a writable temporary copy.

shared/ is distributed without symbolic links and without `.git` directories: a link arrives as a small
text file holding its target, and `.git` folders are dropped. The harness turns them back into what the
case README describes, so the product sees the real fault (links, nested `.git`), not a text file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import CORPUS

# case -> relative paths that are symbolic links in the original corpus (their text is the target)
SYMLINKS: dict[str, list[str]] = {
    "MAN02-symlinks-in-model-dir": [
        "model_file_link/model-00002-of-00002.safetensors",
        "model_abs_link/tokenizer.json",
        "model_dir_link/extra",
        "model_signed_allow/model-00002-of-00002.safetensors",
    ],
    "MAN03-symlink-cycle": ["model/self", "model/sub/loop"],
}
# case -> files to (re)create: `.git` content stripped from shared/
EXTRA_FILES: dict[str, dict[str, str]] = {
    "MAN04-added-removed-renamed-files": {
        "toplevel_git_ignored/.git/HEAD": "ref: refs/heads/main\n",
        "nested_git/sub/.git/hooks/post-checkout": "#!/bin/sh\ntouch /tmp/modelsec_marker_MAN04\n",
    },
}


def case_ids(prefixes: tuple[str, ...]) -> list[str]:
    if not CORPUS.is_dir():
        return []
    return sorted(p.name for p in CORPUS.iterdir() if p.is_dir() and p.name.startswith(prefixes))


def expected(case: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((CORPUS / case / "expected.json").read_text())
    return result


def materialise(case: str, tmp: Path) -> Path:
    dst = tmp / case
    shutil.copytree(CORPUS / case, dst, symlinks=True)
    for dirpath, _dirnames, filenames in os.walk(dst):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, 0o644)
    for rel in SYMLINKS.get(case, []):
        p = dst / rel
        if p.is_symlink():
            continue
        target = p.read_text()
        p.unlink()
        p.symlink_to(target)
    for rel, content in EXTRA_FILES.get(case, {}).items():
        p = dst / rel
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(content)
    return dst


def mentions_all(text: str, patterns: list[str]) -> bool:
    return all(re.search(p, text) for p in patterns)


def payload(bundle: Path | bytes) -> bytes:
    """The DSSE payload bytes of a bundle file (or bundle bytes), decoded without any verification."""
    import base64

    data = bundle.read_bytes() if isinstance(bundle, Path) else bundle
    return base64.b64decode(json.loads(data)["dsseEnvelope"]["payload"])


def defective_pae_fixture(target: str, bundle: Path | bytes) -> bool:
    """DSSE02 `sigs/pae_char_length.sig` with an ASCII payload: byte-for-byte a valid bundle (see the
    note in test_corpus_verify), which a correct verifier must accept."""
    return target == "sigs/pae_char_length.sig" and payload(bundle).isascii()
