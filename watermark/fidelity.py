"""Fidelity probes: the functional effect of a watermark, measured on the model it marks.

A probe runs the unmarked model once on a fixed probe set (`prepare`), then each candidate marked copy
(`loss`), and reports one loss in [0, 1] (0 = no measurable change); `modelsec.watermark.budget` keeps the
loss within a budget. The probe set is committed to by `digest` (SHA-256 of its canonical JSON), which the
attestation records with the metric, the value and the budget.

* `EncoderProbe` (transformers models whose architecture is not a causal LM, e.g. BERT/MiniLM): mean-pooled
  last hidden state per input; loss = 1 - min over inputs of its cosine to the unmarked model's (a *per
  input* worst case, not an average).
* `CausalLMProbe` (architectures ending in `ForCausalLM`): greedy continuations of every prompt; loss = the
  fraction of prompts whose continuation is not identical token for token. The largest absolute change of
  the next-token logits over the prompts (logit drift, in logit units) is reported alongside.
* `ClassifierProbe` (a caller-supplied factory, e.g. the robustness gate's `--arch`): loss = the
  fraction of probe inputs whose predicted class changed; the largest absolute change of a class logit over
  the probe inputs (logit drift) is reported alongside: of two marks that change no probe prediction, the
  one with less drift is less likely to change a prediction outside the probe set.

What is not measured: anything outside the probe set. A probe loads weights with `use_safetensors=True` and
never runs code from the model directory (`trust_remote_code=False`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from modelsec.errors import MalformedArtifactError, PolicyError

__all__ = [
    "DEFAULT_PROBE_TEXTS",
    "CausalLMProbe",
    "ClassifierProbe",
    "EncoderProbe",
    "FidelityProbe",
    "FidelityReport",
    "auto_probe",
]

#: Plain English probe sentences (written for this project; no licence restrictions).
DEFAULT_PROBE_TEXTS: tuple[str, ...] = (
    "A man is eating food.",
    "The girl is carrying a baby.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "Paris is the capital of France.",
    "How do I reset my password?",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The meeting was moved to Thursday afternoon.",
    "She opened the window and the room filled with cold air.",
    "Please send me the report before the end of the week.",
    "The train to the airport leaves every twenty minutes.",
    "Signed attestations bind a watermark to the model's root digest.",
    "Quantisation to four bits shrinks the model at a small cost in accuracy.",
    "My favourite season is autumn because of the colours.",
)


@dataclass(frozen=True, slots=True)
class FidelityReport:
    """A measured fidelity loss (what the attestation records under `fidelity`).

    Attributes:
        metric: What `value` measures (e.g. `1-min-cosine(last-hidden-state)`).
        value: The loss, in [0, 1].
        budget: The largest loss accepted.
        probe_set_digest: `sha256:<hex>` of the probe set's canonical JSON.
        probes: Number of probe inputs.
        logit_drift: Causal LMs: largest absolute change of a next-token logit; classifiers: of a class
            logit (None otherwise).
    """

    metric: str
    value: float
    budget: float
    probe_set_digest: str
    probes: int
    logit_drift: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The report as recorded in the watermark predicate (camelCase keys)."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "value": self.value,
            "budget": self.budget,
            "probeSetDigest": self.probe_set_digest,
            "probes": self.probes,
        }
        if self.logit_drift is not None:
            out["logitDrift"] = self.logit_drift
        return out


class FidelityProbe(Protocol):
    """Measures how much a marked copy's outputs differ from the unmarked model's on a fixed probe set."""

    @property
    def metric(self) -> str:
        """Name of the loss (recorded in the attestation)."""
        ...

    @property
    def size(self) -> int:
        """Number of probe inputs."""
        ...

    def digest(self) -> str:
        """`sha256:<hex>` of the probe set's canonical JSON."""
        ...

    def prepare(self, model_dir: Path) -> None:
        """Run the unmarked model once and keep its outputs."""
        ...

    def loss(self, marked_dir: Path) -> tuple[float, float | None]:
        """The loss of a marked copy in [0, 1], and the logit drift where the probe measures one."""
        ...


def _digest(description: dict[str, Any]) -> str:
    body = json.dumps(description, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and (e.name or "").partition(".")[0] != "transformers":
            raise  # an extra's module (torch, numpy): the CLI names the extra to install
        raise PolicyError(
            "measuring the fidelity of a transformers model needs the `transformers` package; install it, or "
            "embed without a fidelity budget"
        ) from e
    return transformers


def _load(model_dir: Path, causal: bool) -> Any:
    import torch

    tf = _transformers()
    cls = tf.AutoModelForCausalLM if causal else tf.AutoModel
    try:
        model = cls.from_pretrained(
            str(model_dir), use_safetensors=True, trust_remote_code=False, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise MalformedArtifactError(f"{model_dir}: cannot load the model to measure fidelity: {e}") from e
    model.eval()
    return model


def _tokenizer(model_dir: Path) -> Any:
    tf = _transformers()
    try:
        return tf.AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:
        raise MalformedArtifactError(
            f"{model_dir}: cannot load the tokenizer to measure fidelity: {e}"
        ) from e


class EncoderProbe:
    """Mean-pooled last hidden state per input; loss = 1 - the smallest cosine over inputs."""

    metric = "1-min-cosine(mean-pooled last hidden state)"

    def __init__(self, texts: Sequence[str] = DEFAULT_PROBE_TEXTS) -> None:
        """Probe with these texts (default: `DEFAULT_PROBE_TEXTS`)."""
        if not texts:
            raise PolicyError("the fidelity probe set is empty")
        self.texts = tuple(texts)
        self._reference: Any = None
        self._batch: Any = None

    @property
    def size(self) -> int:
        """Number of probe texts."""
        return len(self.texts)

    def digest(self) -> str:
        """`sha256:<hex>` of the probe texts and the metric."""
        return _digest({"probe": "encoder", "metric": self.metric, "inputs": list(self.texts)})

    def _embed(self, model_dir: Path) -> Any:
        import torch

        model = _load(model_dir, causal=False)
        with torch.no_grad():
            hidden = model(**self._batch).last_hidden_state
        mask = self._batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1)

    def prepare(self, model_dir: Path) -> None:
        """Tokenize the texts and keep the unmarked model's pooled states."""
        self._batch = _tokenizer(model_dir)(list(self.texts), padding=True, return_tensors="pt")
        self._reference = self._embed(model_dir)

    def loss(self, marked_dir: Path) -> tuple[float, float | None]:
        """1 - min cosine over the probe texts (no logit drift for encoders)."""
        import torch

        if self._reference is None:
            raise PolicyError("fidelity probe used before prepare()")
        cos = torch.nn.functional.cosine_similarity(self._embed(marked_dir), self._reference, dim=-1)
        return max(0.0, 1.0 - float(cos.min())), None


class CausalLMProbe:
    """Greedy continuations; loss = fraction of prompts whose continuation changed; plus logit drift."""

    metric = "1-greedy-agreement"

    def __init__(self, prompts: Sequence[str] = DEFAULT_PROBE_TEXTS, *, new_tokens: int = 16) -> None:
        """Probe with these prompts, `new_tokens` greedy tokens each."""
        if not prompts:
            raise PolicyError("the fidelity probe set is empty")
        if not 1 <= new_tokens <= 1024:
            raise PolicyError(f"new_tokens must be in [1, 1024], got {new_tokens}")
        self.prompts = tuple(prompts)
        self.new_tokens = new_tokens
        self._ids: list[Any] = []
        self._reference: list[tuple[list[int], Any]] = []

    @property
    def size(self) -> int:
        """Number of prompts."""
        return len(self.prompts)

    def digest(self) -> str:
        """`sha256:<hex>` of the prompts, the continuation length and the metric."""
        return _digest(
            {
                "probe": "causal-lm",
                "metric": self.metric,
                "newTokens": self.new_tokens,
                "inputs": list(self.prompts),
            }
        )

    def _run(self, model_dir: Path) -> list[tuple[list[int], Any]]:
        """Each prompt's greedy continuation and first-step logits.

        Prompts of the same token length run as one batch over the KV cache (no padding, so each row computes
        what it would alone; measured 4-5x less CPU than one prompt at a time on the fortunes test model).
        """
        import torch

        model = _load(model_dir, causal=True)
        by_length: dict[int, list[int]] = {}
        for i, ids in enumerate(self._ids):
            by_length.setdefault(int(ids.shape[1]), []).append(i)
        out: list[tuple[list[int], Any]] = [([], None)] * len(self._ids)
        with torch.no_grad():
            for rows in by_length.values():
                step = model(input_ids=torch.cat([self._ids[i] for i in rows]), use_cache=True)
                first = step.logits[:, -1].clone()
                tokens = [step.logits[:, -1].argmax(-1)]
                while len(tokens) < self.new_tokens:  # plain greedy: no sampling, no generation config
                    step = model(input_ids=tokens[-1].view(-1, 1), cache=step.cache, use_cache=True)
                    tokens.append(step.logits[:, -1].argmax(-1))
                continuations = torch.stack(tokens, dim=1).tolist()
                for j, i in enumerate(rows):
                    out[i] = (continuations[j], first[j])
        return out

    def prepare(self, model_dir: Path) -> None:
        """Tokenize the prompts and keep the unmarked model's continuations and first-step logits."""
        tok = _tokenizer(model_dir)
        self._ids = [tok(p, return_tensors="pt")["input_ids"] for p in self.prompts]
        if any(ids.shape[1] == 0 for ids in self._ids):
            raise PolicyError("a fidelity probe prompt tokenizes to nothing")
        self._reference = self._run(model_dir)

    def compare(self, marked_dir: Path) -> tuple[list[int], float]:
        """Indices of the prompts whose greedy continuation changed, and the largest first-step logit change.

        Raises:
            PolicyError: The probe was not prepared.
            MalformedArtifactError: The marked model cannot be loaded.
        """
        if not self._reference:
            raise PolicyError("fidelity probe used before prepare()")
        marked = self._run(marked_dir)
        changed = [i for i, (a, b) in enumerate(zip(self._reference, marked, strict=True)) if a[0] != b[0]]
        drift = max(float((a[1] - b[1]).abs().max()) for a, b in zip(self._reference, marked, strict=True))
        return changed, drift

    def loss(self, marked_dir: Path) -> tuple[float, float | None]:
        """Fraction of prompts whose greedy continuation changed, and the largest first-step logit change."""
        changed, drift = self.compare(marked_dir)
        return len(changed) / len(self.prompts), drift


class ClassifierProbe:
    """Predicted classes of a classifier built by a factory; loss = fraction of changed predictions."""

    metric = "changed-predictions"

    def __init__(self, factory: Callable[[], Any], inputs: Any, *, name: str) -> None:
        """Probe `factory()` (an `nn.Module` whose state_dict keys are the tensor names) on `inputs`.

        Args:
            factory: Builds the network without arguments (e.g. the gate's `--architecture`).
            inputs: A float tensor (N, ...) of probe inputs.
            name: The factory's import path (recorded in the probe set digest).
        """
        if int(inputs.shape[0]) == 0:
            raise PolicyError("the fidelity probe set is empty")
        self.factory = factory
        self.inputs = inputs
        self.name = name
        self._reference: Any = None

    @property
    def size(self) -> int:
        """Number of probe inputs."""
        return int(self.inputs.shape[0])

    def digest(self) -> str:
        """`sha256:<hex>` of the architecture name, the metric and the input tensor's bytes."""
        data = self.inputs.detach().to("cpu").contiguous().numpy().tobytes()
        return _digest(
            {
                "probe": "classifier",
                "metric": self.metric,
                "architecture": self.name,
                "shape": list(self.inputs.shape),
                "inputsSha256": hashlib.sha256(data).hexdigest(),
            }
        )

    def _module(self, model_dir: Path) -> Any:
        import torch
        from safetensors.torch import load_file

        state: dict[str, Any] = {}
        for path in sorted(model_dir.glob("*.safetensors")):
            try:
                state.update(load_file(str(path)))
            except Exception as e:  # safetensors' own error types: the file is named instead
                raise MalformedArtifactError(
                    f"{path}: cannot load the weights to measure fidelity: {e}"
                ) from e
        try:
            module = self.factory()
        except Exception as e:
            raise PolicyError(f"architecture {self.name}: factory failed: {type(e).__name__}: {e}") from e
        if not isinstance(module, torch.nn.Module):
            raise PolicyError(f"architecture {self.name}: the factory returned a {type(module).__name__}")
        try:
            module.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise PolicyError(
                f"architecture {self.name} does not match the weights of {model_dir}: {e}"
            ) from e
        module.eval()
        return module

    def _logits(self, model_dir: Path) -> Any:
        import torch

        module = self._module(model_dir)
        with torch.no_grad():
            return module(self.inputs)

    def prepare(self, model_dir: Path) -> None:
        """Keep the unmarked model's logits."""
        self._reference = self._logits(model_dir)

    def loss(self, marked_dir: Path) -> tuple[float, float | None]:
        """Fraction of probe inputs whose predicted class changed, and the largest change of a logit."""
        if self._reference is None:
            raise PolicyError("fidelity probe used before prepare()")
        marked = self._logits(marked_dir)
        changed = (marked.argmax(-1) != self._reference.argmax(-1)).float().mean()
        return float(changed), float((marked - self._reference).abs().max())


def auto_probe(model_dir: Path, texts: Sequence[str] | None = None) -> FidelityProbe | None:
    """The probe for a transformers model directory (config.json with `model_type`), or None.

    Args:
        model_dir: The unmarked model.
        texts: Probe texts (default `DEFAULT_PROBE_TEXTS`).

    Returns:
        `CausalLMProbe` when an architecture ends in `ForCausalLM`, `EncoderProbe` otherwise; None when the
        directory has no config.json with a string `model_type` (not a transformers model).

    Raises:
        MalformedArtifactError: config.json exists but is not a JSON object.
    """
    config = model_dir / "config.json"
    if not config.is_file() or config.is_symlink():
        return None
    try:
        data = json.loads(config.read_bytes()[: 1 << 20])
    except (OSError, ValueError) as e:
        raise MalformedArtifactError(f"{config}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise MalformedArtifactError(f"{config}: not a JSON object")
    if not isinstance(data.get("model_type"), str):
        return None
    arch = data.get("architectures")
    names = [a for a in arch if isinstance(a, str)] if isinstance(arch, list) else []
    chosen = tuple(texts) if texts is not None else DEFAULT_PROBE_TEXTS
    if any(a.endswith("ForCausalLM") for a in names):
        return CausalLMProbe(chosen)
    return EncoderProbe(chosen)


def check_budget(value: float) -> float:
    """Validate a fidelity budget (a loss in [0, 1]).

    Raises:
        PolicyError: Not a finite number in [0, 1].
    """
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise PolicyError(f"the fidelity budget must be a loss in [0, 1], got {value}")
    return value
