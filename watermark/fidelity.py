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
        greedy: The careful path's figures (`GreedyFidelity`; None otherwise).
        met: False only when the mark was written although it misses the bar (`--weakest-mark`).
        grades_cached: Careful path: whether the per-tensor grades came from the cache (None otherwise).
    """

    metric: str
    value: float
    budget: float
    probe_set_digest: str
    probes: int
    logit_drift: float | None = None
    greedy: GreedyFidelity | None = None
    met: bool = True
    grades_cached: bool | None = None

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
        if self.greedy is not None:
            out["greedy"] = self.greedy.to_json()
            out["met"] = self.met
        if self.grades_cached is not None:
            out["gradesCached"] = self.grades_cached
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
            "embed without measuring fidelity (--no-fidelity-check; API: careless=True)"
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


# --- issue 30: fidelity judged the way users judge it -------------------------------------------------------

#: A greedy continuation counts as changed only where the unmarked model's top-2 log-probability gap at the
#: first differing token exceeds this (nats): below it the unmarked model itself is at a near-tie, which
#: running it in bf16 already crosses (issue 30).
GATE_NATS = 0.05
#: The stricter gate reported beside it (nats).
NEAR_TIE_NATS = 0.01
#: One-sided confidence of the Clopper-Pearson bound on the changed rate.
BOUND_CONFIDENCE = 0.95


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (exact up to float rounding)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]  # fmt: skip
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def clopper_pearson_upper(k: int, n: int, confidence: float = BOUND_CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial rate after `k` events in `n` trials.

    The largest `p` with `P(X <= k; n, p) >= 1 - confidence` (Clopper and Pearson, Biometrika 1934), found
    by bisection to 1e-12. With `k = 0` it is `1 - (1 - confidence) ** (1 / n)` (about 3/n at 95 %).

    Args:
        k: Events observed (0 <= k <= n).
        n: Trials (> 0).
        confidence: One-sided confidence in (0, 1).

    Raises:
        PolicyError: `n <= 0`, `k` outside [0, n], or a confidence outside (0, 1).
    """
    if n <= 0 or not 0 <= k <= n:
        raise PolicyError(f"a rate bound needs 0 <= events <= trials and trials > 0, got {k} of {n}")
    if not 0.0 < confidence < 1.0:
        raise PolicyError(f"the bound's confidence must be in (0, 1), got {confidence}")
    if k == n:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = k / n, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        if _binomial_cdf(k, n, mid) >= alpha:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True, slots=True)
class GreedyFidelity:
    """Issue 30's fidelity of a marked causal LM against the unmarked one, on one probe set.

    Greedy pairs (prompt x key) are compared token for token. A pair is *changed* under a gate `g` when
    the continuations differ and the unmarked model's top-2 log-probability gap at the first differing
    token exceeds `g` nats. Teacher-forced figures run both models on the prompt plus the unmarked model's
    continuation and compare every next-token distribution; the bf16 figures do the same for the unmarked
    model run in bfloat16 (its weights and activations), measured in the same run, as the yardstick of a
    change users already accept.

    Attributes:
        pairs: Prompt x key pairs compared.
        exact_unchanged: Pairs whose continuations are identical token for token.
        tie_unchanged: Pairs unchanged under the `NEAR_TIE_NATS` gate.
        gated_unchanged: Pairs unchanged under the `gate_nats` gate (the acceptance figure).
        gate_nats: The gate (nats).
        changed_upper_bound: Clopper-Pearson upper bound (at `confidence`) on the gated changed rate of
            prompts drawn like the probe's (not of other inputs).
        confidence: The bound's one-sided confidence.
        positions: Teacher-forced positions compared per key.
        flip_rate: Fraction of teacher-forced positions whose top-1 token differs (marked vs unmarked).
        mean_kl: Mean KL(unmarked || marked) per position (nats).
        bf16_flip_rate: The same for the unmarked model run in bf16.
        bf16_mean_kl: The same for the unmarked model run in bf16 (nats).
        perplexity_change: Per key, relative perplexity change (marked / unmarked - 1) on the probe's
            perplexity text.
    """

    pairs: int
    exact_unchanged: int
    tie_unchanged: int
    gated_unchanged: int
    gate_nats: float
    changed_upper_bound: float
    confidence: float
    positions: int
    flip_rate: float
    mean_kl: float
    bf16_flip_rate: float
    bf16_mean_kl: float
    perplexity_change: tuple[float, ...]

    @property
    def gated_rate(self) -> float:
        """Fraction of pairs unchanged under the gate."""
        return self.gated_unchanged / self.pairs if self.pairs else 1.0

    @property
    def exact_rate(self) -> float:
        """Fraction of pairs identical token for token."""
        return self.exact_unchanged / self.pairs if self.pairs else 1.0

    @property
    def tie_rate(self) -> float:
        """Fraction of pairs unchanged under the `NEAR_TIE_NATS` gate."""
        return self.tie_unchanged / self.pairs if self.pairs else 1.0

    def shortfalls(self, min_unchanged: float, max_perplexity_change: float) -> list[str]:
        """What misses issue 30's bar, in words with the figures (empty: the bar is met).

        The bar: the bound on the gated changed rate at most `1 - min_unchanged`; teacher-forced flip rate
        and mean KL no larger than bf16 inference's; every key's |perplexity change| at most
        `max_perplexity_change`.
        """
        out: list[str] = []
        if self.changed_upper_bound > 1.0 - min_unchanged:
            out.append(
                f"{self.pairs - self.gated_unchanged}/{self.pairs} probe continuations changed at a top-2 "
                "gap "
                f"over {self.gate_nats:g} nats: the changed rate is bounded only by "
                f"{self.changed_upper_bound:.2%} ({self.confidence:.0%} Clopper-Pearson), over "
                f"{1.0 - min_unchanged:.2%}"
            )
        if self.flip_rate > self.bf16_flip_rate:
            out.append(
                f"teacher-forced top-1 flip rate {self.flip_rate:.3%} > bf16's {self.bf16_flip_rate:.3%}"
            )
        if self.mean_kl > self.bf16_mean_kl:
            out.append(f"mean KL {self.mean_kl:.3g} nats > bf16's {self.bf16_mean_kl:.3g}")
        worst = max((abs(p) for p in self.perplexity_change), default=0.0)
        if worst > max_perplexity_change:
            out.append(f"perplexity change {worst:.3%} > {max_perplexity_change:.2%}")
        return out

    def summary(self) -> str:
        """One line with every figure (as the CLI prints it)."""
        ppl = max((abs(p) for p in self.perplexity_change), default=0.0)
        return (
            f"{self.gated_unchanged}/{self.pairs} continuations unchanged at a top-2 gap over "
            f"{self.gate_nats:g} nats ({self.gated_rate:.2%}; changed rate <= {self.changed_upper_bound:.2%} "
            f"at {self.confidence:.0%}), {self.tie_rate:.2%} at {NEAR_TIE_NATS:g} nats, "
            f"{self.exact_rate:.2%} "
            f"identical; teacher-forced flips {self.flip_rate:.3%} (bf16 {self.bf16_flip_rate:.3%}), mean KL "
            f"{self.mean_kl:.3g} (bf16 {self.bf16_mean_kl:.3g}); perplexity change <= {ppl:.3%}"
        )

    def to_json(self) -> dict[str, Any]:
        """The figures with camelCase keys (rates as fractions, KL in nats)."""
        return {
            "pairs": self.pairs,
            "exactUnchanged": self.exact_unchanged,
            "tieUnchanged": self.tie_unchanged,
            "tieNats": NEAR_TIE_NATS,
            "gatedUnchanged": self.gated_unchanged,
            "gateNats": self.gate_nats,
            "changedUpperBound": self.changed_upper_bound,
            "boundConfidence": self.confidence,
            "teacherForcedPositions": self.positions,
            "flipRate": self.flip_rate,
            "meanKl": self.mean_kl,
            "bf16FlipRate": self.bf16_flip_rate,
            "bf16MeanKl": self.bf16_mean_kl,
            "perplexityChange": list(self.perplexity_change),
        }


def _greedy_with_gaps(model: Any, ids: Sequence[Any], new_tokens: int) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy continuation and the top-2 log-probability gap (nats) at every step.

    Prompts of the same token length run as one batch over the KV cache (no padding, so each row computes
    what it would alone).
    """
    import torch

    by_length: dict[int, list[int]] = {}
    for i, x in enumerate(ids):
        by_length.setdefault(int(x.shape[1]), []).append(i)
    out: list[tuple[list[int], list[float]]] = [([], [])] * len(ids)
    with torch.no_grad():
        for rows in by_length.values():
            step = model(input_ids=torch.cat([ids[i] for i in rows]), use_cache=True)
            tokens: list[Any] = []
            gaps: list[Any] = []
            while True:
                top = torch.log_softmax(step.logits[:, -1].float(), -1).topk(2, dim=-1)
                tokens.append(top.indices[:, 0])
                gaps.append(top.values[:, 0] - top.values[:, 1])
                if len(tokens) == new_tokens:
                    break
                step = model(input_ids=tokens[-1].view(-1, 1), cache=step.cache, use_cache=True)
            conts = torch.stack(tokens, 1).tolist()
            gap = torch.stack(gaps, 1).tolist()
            for j, i in enumerate(rows):
                out[i] = (conts[j], gap[j])
    return out


def _log_probs_by_group(model: Any, groups: Sequence[Any]) -> list[Any]:
    """Log-softmax (float32) of every position of each (batch, length) token group."""
    import torch

    with torch.no_grad():
        return [torch.log_softmax(model(input_ids=g).logits.float(), -1) for g in groups]


def _nll(model: Any, groups: Sequence[Any]) -> tuple[float, int]:
    """Summed next-token negative log-likelihood (nats) and token count over the token groups."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for g in groups:
            if g.shape[1] < 2:
                continue
            logp = torch.log_softmax(model(input_ids=g).logits[:, :-1].float(), -1)
            total -= float(logp.gather(-1, g[:, 1:, None]).sum())
            count += int(g[:, 1:].numel())
    return total, count


def _by_length(seqs: Sequence[Sequence[int]]) -> list[Any]:
    import torch

    groups: dict[int, list[Sequence[int]]] = {}
    for s in seqs:
        groups.setdefault(len(s), []).append(s)
    return [torch.tensor(v, dtype=torch.long) for _, v in sorted(groups.items())]


class GreedyFidelityProbe:
    """Issue 30's metric: gated greedy agreement, teacher-forced flips and KL against bf16, perplexity.

    `prepare` runs the unmarked model once (float32): greedy continuations with the top-2 gap of every step
    and the perplexity. `measure` compares one or more marked copies (one per key) and returns a
    `GreedyFidelity`; its first call also measures the bf16 yardstick (the unmarked model run in bfloat16)
    in the same pass over the reference outputs. Prompts of one token length run as one batch, without
    padding. The model is loaded with `use_safetensors=True` and `trust_remote_code=False`; nothing outside
    the probe set is measured.

    Example:
        >>> probe = GreedyFidelityProbe(prompts)  # doctest: +SKIP
        >>> probe.prepare(Path("model")); probe.measure([Path("model-wm")]).summary()  # doctest: +SKIP
    """

    metric = "gated-greedy-changed-upper-bound"

    def __init__(
        self,
        prompts: Sequence[str],
        *,
        new_tokens: int = 16,
        gate_nats: float = GATE_NATS,
        perplexity_texts: Sequence[str] | None = None,
        confidence: float = BOUND_CONFIDENCE,
    ) -> None:
        """Probe with these prompts, `new_tokens` greedy tokens each.

        Args:
            prompts: Probe prompts (the pairs per key).
            new_tokens: Greedy tokens per prompt, in [1, 1024].
            gate_nats: The gate of the changed count (nats, >= 0).
            perplexity_texts: Text whose perplexity is compared (default: the prompts).
            confidence: One-sided confidence of the bound on the changed rate.

        Raises:
            PolicyError: No prompt, or a setting out of range.
        """
        if not prompts:
            raise PolicyError("the fidelity probe set is empty")
        if not 1 <= new_tokens <= 1024:
            raise PolicyError(f"new_tokens must be in [1, 1024], got {new_tokens}")
        if not (math.isfinite(gate_nats) and gate_nats >= 0):
            raise PolicyError(f"the gate must be a finite number of nats >= 0, got {gate_nats}")
        clopper_pearson_upper(0, 1, confidence)  # validates the confidence
        self.prompts = tuple(prompts)
        self.new_tokens = new_tokens
        self.gate_nats = gate_nats
        self.confidence = confidence
        self.perplexity_texts = tuple(perplexity_texts) if perplexity_texts is not None else self.prompts
        self._ids: list[Any] = []
        self._reference: list[tuple[list[int], list[float]]] = []
        self._model: Any = None
        self._forced: list[Any] = []
        self._ppl_groups: list[Any] = []
        self._ppl: float = math.nan
        self._bf16: tuple[float, float] = (math.nan, math.nan)

    @property
    def size(self) -> int:
        """Number of prompts (pairs per key)."""
        return len(self.prompts)

    def digest(self) -> str:
        """`sha256:<hex>` of the prompts, the continuation length, the gate and the metric."""
        return _digest(
            {
                "probe": "causal-lm-gated",
                "metric": self.metric,
                "newTokens": self.new_tokens,
                "gateNats": self.gate_nats,
                "inputs": list(self.prompts),
            }
        )

    @property
    def model(self) -> Any:
        """The unmarked model `prepare` loaded (float32)."""
        if self._model is None:
            raise PolicyError("fidelity probe used before prepare()")
        return self._model

    def sequences(self, limit: int | None = None) -> list[Any]:
        """The first `limit` prompts (all: None) with their unmarked continuations, as token groups.

        Returns:
            (batch, length) int64 tensors, one per length (after `prepare`).
        """
        if not self._reference:
            raise PolicyError("fidelity probe used before prepare()")
        seqs = [x[0].tolist() + cont for x, (cont, _) in zip(self._ids, self._reference, strict=True)]
        return _by_length(seqs[:limit])

    def prepare(self, model_dir: Path, model: Any = None) -> None:
        """Run the unmarked model (float32, or `model` if given): continuations, gaps, bf16 yardstick.

        Raises:
            PolicyError: A prompt tokenizes to nothing.
            MalformedArtifactError: The model or tokenizer cannot be loaded.
        """
        tok = _tokenizer(model_dir)
        self._ids = [tok(p, return_tensors="pt")["input_ids"] for p in self.prompts]
        if any(x.shape[1] == 0 for x in self._ids):
            raise PolicyError("a fidelity probe prompt tokenizes to nothing")
        self._model = model if model is not None else _load(model_dir, causal=True)
        self._reference = _greedy_with_gaps(self._model, self._ids, self.new_tokens)
        self._forced = _by_length(
            [x[0].tolist() + cont for x, (cont, _) in zip(self._ids, self._reference, strict=True)]
        )
        self._ppl_groups = _by_length(
            [t for t in (tok(s)["input_ids"] for s in self.perplexity_texts) if len(t) >= 2]
        )
        nll, count = _nll(self._model, self._ppl_groups)
        self._ppl = math.exp(nll / max(1, count))
        self._bf16 = (math.nan, math.nan)

    def _teacher_forced(self, other: Any) -> tuple[int, float, float]:
        """(positions, top-1 flip rate, mean KL(unmarked || other)) over the forced sequences.

        The bf16 yardstick is measured in the first call, in the same pass over the unmarked model's
        outputs (each reference forward serves both comparisons).
        """
        import copy

        import torch

        bf16 = copy.deepcopy(self._model).to(torch.bfloat16) if math.isnan(self._bf16[0]) else None
        positions, flips, kl, bf_flips, bf_kl = 0, 0, 0.0, 0, 0.0
        with torch.no_grad():
            for g in self._forced:
                ref = torch.log_softmax(self._model(input_ids=g).logits.float(), -1)
                top = ref.argmax(-1)
                p = ref.exp()
                for model, sums in ((other, 0), (bf16, 1)):
                    if model is None:
                        continue
                    got = torch.log_softmax(model(input_ids=g).logits.float(), -1)
                    f, k = int((top != got.argmax(-1)).sum()), float((p * (ref - got)).sum())
                    if sums:
                        bf_flips, bf_kl = bf_flips + f, bf_kl + k
                    else:
                        flips, kl = flips + f, kl + k
                    del got
                positions += int(ref.shape[0] * ref.shape[1])
        n = max(1, positions)
        if bf16 is not None:
            self._bf16 = (bf_flips / n, bf_kl / n)
        return positions, flips / n, kl / n

    def measure(self, marked_dirs: Sequence[Path]) -> GreedyFidelity:
        """Compare marked copies of the prepared model (one per key) with it.

        Args:
            marked_dirs: Marked model directories (same architecture and tokenizer).

        Returns:
            The figures over `len(prompts) x len(marked_dirs)` pairs; teacher-forced figures are means over
            the keys.

        Raises:
            PolicyError: The probe was not prepared, or no directory is given.
            MalformedArtifactError: A marked model cannot be loaded.
        """
        if not self._reference or self._model is None:
            raise PolicyError("fidelity probe used before prepare()")
        if not marked_dirs:
            raise PolicyError("no marked model to measure")
        pairs = exact = tie = gated = positions = 0
        flip_sum = kl_sum = 0.0
        ppl: list[float] = []
        for d in marked_dirs:
            marked = _load(Path(d), causal=True)
            got = _greedy_with_gaps(marked, self._ids, self.new_tokens)
            for (ref, gaps), (cont, _) in zip(self._reference, got, strict=True):
                pairs += 1
                first = next((j for j, (a, b) in enumerate(zip(ref, cont, strict=True)) if a != b), None)
                if first is None:
                    exact += 1
                    tie += 1
                    gated += 1
                    continue
                tie += gaps[first] <= NEAR_TIE_NATS
                gated += gaps[first] <= self.gate_nats
            n, flips, kl = self._teacher_forced(marked)
            positions = n
            flip_sum += flips
            kl_sum += kl
            nll, count = _nll(marked, self._ppl_groups)
            ppl.append(math.exp(nll / max(1, count)) / self._ppl - 1.0)
            del marked
        k = len(marked_dirs)
        return GreedyFidelity(
            pairs=pairs,
            exact_unchanged=exact,
            tie_unchanged=tie,
            gated_unchanged=gated,
            gate_nats=self.gate_nats,
            changed_upper_bound=clopper_pearson_upper(pairs - gated, pairs, self.confidence),
            confidence=self.confidence,
            positions=positions,
            flip_rate=flip_sum / k,
            mean_kl=kl_sum / k,
            bf16_flip_rate=self._bf16[0],
            bf16_mean_kl=self._bf16[1],
            perplexity_change=tuple(ppl),
        )
