"""The policy is chosen from the directory that was opened, never from a path resolved before the open.

The attacker can write the folder above a production model. The production name holds the attacker's
model (signed by the sandbox key, with remote code), which the production policy refuses; a link beside it
points at the sandbox, whose policy trusts the sandbox key and allows remote code. A child process
exchanges the production name and the link (`renameat2(RENAME_EXCHANGE)`) in a loop while each front door
verifies the production path again and again. The old code matched `file://<realpath>` first (sometimes
the sandbox, through the link) and opened the name afterwards (sometimes the attacker's directory): the
attacker's model passed under the sandbox policy. Now every outcome must be a specific refusal.
"""

from __future__ import annotations

import itertools
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from modelsec.algorithms import SignatureAlgorithm
from modelsec.errors import Error, SignatureError, VerificationError
from modelsec.policy import PolicySet
from modelsec.service.client import ChannelOptions, ModelsecClient
from modelsec.signer import load_private_key_file, sign_model
from modelsec.verifier import load_model, verify_model
from modelsec.verifier.admission import admit_model
from tests.conftest import write_tiny_model
from tests.support.policies import policy_doc, policy_entry, write_policy_doc
from tests.support.race import swapping
from tests.support.service import InThreadServer, write_server_config

P256 = SignatureAlgorithm.ECDSA_P256.value
P384 = SignatureAlgorithm.ECDSA_P384.value
ATTEMPTS = 2_000

pytestmark = pytest.mark.slow


class Setup:
    """The production name (the attacker's model), the sandbox, the link to it, and the policy file."""

    def __init__(self, base: Path, key_dir: Path) -> None:
        self.base = base
        self.prod, self.sandbox, self.link = base / "prod", base / "sandbox", base / "link"
        attacker = write_tiny_model(self.prod, seed=7)
        config = '{"model_type": "tiny", "auto_map": {"AutoModel": "modeling.M"}}'
        (attacker / "config.json").write_text(config)
        (attacker / "modeling.py").write_text("import os\nos.system('touch pwned')\n")
        sign_model(attacker, [load_private_key_file(key_dir / f"{P256}.key.pem")])
        shutil.copytree(attacker, self.sandbox)
        self.link.symlink_to(self.sandbox)
        doc = policy_doc(
            policy_entry(
                name="production",
                match=[f"file://{self.prod}", f"file://{self.prod}/**"],
                keys=[key_dir / f"{P384}.pub.pem"],
            ),
            policy_entry(
                name="sandbox",
                match=[f"file://{self.sandbox}", f"file://{self.sandbox}/**"],
                keys=[key_dir / f"{P256}.pub.pem"],
                allowRemoteCode=True,
            ),
        )
        self.policy_file = write_policy_doc(base.parent / "policy.json", doc)
        self.policies = PolicySet.from_file(self.policy_file)
        self.digest = verify_model(self.sandbox, admit_model(self.sandbox, self.policies)).root_digest

    def check_without_race(self) -> None:
        """Without the race the attacker's model is refused at the production name, passes in the sandbox."""
        with pytest.raises(SignatureError):
            verify_model(self.prod, admit_model(self.prod, self.policies))

    def race(self, attempt: Callable[[], str], attempts: int = ATTEMPTS) -> Counter[str]:
        """Each outcome of `attempts` attempts while the production name and the link are exchanged."""
        self.check_without_race()
        with swapping(self.prod, self.link):
            outcomes = Counter(attempt() for _ in range(attempts))
        assert (self.prod / "model.sig").is_file() and self.link.is_symlink()
        return outcomes


@pytest.fixture
def setup(tmp_path: Path, key_dir: Path) -> Setup:
    return Setup(tmp_path / "models", key_dir)


def _outcome(call: Callable[[], object]) -> str:
    """`ok` when `call` passed, else the class of the modelsec error it raised (anything else fails)."""
    try:
        call()
    except VerificationError as e:
        return type(e).__name__
    return "ok"


def _assert_refused(outcomes: Counter[str]) -> None:
    # The attacker's model never passes: every outcome is a specific refusal (the production policy's, the
    # link's, or a name that moved while it was opened), never a success under the sandbox policy.
    assert sum(outcomes.values()) == ATTEMPTS
    assert "ok" not in outcomes, outcomes
    # The swap interleaved with the opens (more than one kind of outcome). Which kinds depends on the
    # scheduler: under load the swapper can win every attempt that the production policy would decide.
    assert len(outcomes) > 1, outcomes


def test_library_verify_and_load_race(setup: Setup) -> None:
    """`verify_model` and `load_model` of the production path: never verified under the sandbox policy."""
    pytest.importorskip("torch").set_num_threads(1)

    fronts = itertools.cycle(
        [
            lambda: verify_model(setup.prod, setup.policies),
            lambda: verify_model(setup.prod, admit_model(setup.prod, setup.policies)),
            lambda: load_model(setup.prod, setup.policies),
        ]
    )
    _assert_refused(setup.race(lambda: _outcome(next(fronts))))


def test_cli_verify_race(setup: Setup, cli: Callable[..., object]) -> None:
    """`modelsec verify PROD --policy FILE` in-process: exit 1 with a refusal, never exit 0.

    400 attempts, not 2,000: one in-process CLI run costs about 25 ms here (the library test makes the
    2,000; the CLI adds only its own resolution of the path, `--ignore-paths` and the digest pins).
    """

    def attempt() -> str:
        done = cli("verify", str(setup.prod), "--policy", str(setup.policy_file))
        code, err = done.returncode, done.stderr  # type: ignore[attr-defined]
        assert (code in (0, 1) and err.startswith("modelsec: error: ")) or code == 0, err
        return "ok" if code == 0 else "refused"

    outcomes = setup.race(attempt, attempts=400)
    assert outcomes == Counter(refused=400), outcomes


def test_grpc_verify_model_race(setup: Setup, key_dir: Path, tmp_path: Path) -> None:
    """gRPC `VerifyModel`: a refusal verdict every time, never ok and never INTERNAL.

    Its own server: its policy file is the production/sandbox pair and its read root the race's folder.
    """
    config = write_server_config(
        tmp_path / "server", key_dir, policy=str(setup.policy_file), readRoots=[str(setup.base)]
    )
    with InThreadServer(config) as server, ModelsecClient(
        server.target, ChannelOptions(plaintext=True, timeout=30)
    ) as client:

        def attempt() -> str:
            try:
                answer = client.verify_model(str(setup.prod))
            except Error as e:  # an RPC error (INTERNAL) instead of a verdict
                return f"rpc: {type(e).__name__}: {e.diagnostics()}"
            return "ok" if answer.ok else answer.error_kind

        outcomes = setup.race(attempt)
    assert not [o for o in outcomes if o.startswith("rpc")], outcomes
    _assert_refused(outcomes)
