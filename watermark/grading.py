"""Per-tensor strength grades from measured sensitivity: move the weights the probe outputs barely depend on.

The mark needs, per code bit, a fixed correlation gain `kappa sqrt(E_b)`; how it is spread over the bit's
carriers is the embedder's choice and detection does not depend on it. Spreading it uniformly
(`grade = 1` everywhere) changes layers that the outputs are very sensitive to (e.g. the output head and
the MLP of the first layer of a small causal LM) as much as ones they barely depend on (e.g. the
query/key projections of a middle layer: 100 to 300 times less sensitive per weight on the fortunes Llama
of the tests).

Sensitivity of tensor `T`: every weight of `T` alone is moved by `eps |w|` with random signs (the mark's
own shape of change) and `S_T` = mean squared change of the probe outputs (logits of every position of
the prompts and their reference continuations; last hidden state for encoders; class logits for
classifiers), divided by `eps**2`. With a quadratic cost model `sum_T S_T g_T**2 t**2` and a gain
`sum_T n_T g_T t`, the cheapest grades are `g_T ∝ n_T / S_T`, normalised to a largest grade of 1 and
floored at `GRADE_FLOOR` so that no eligible tensor is left out entirely (a tensor the probe set does not
exercise could matter to inputs outside it).

Not measured: anything outside the probe set (as for the probe's loss).

Two ways to measure `S_T`: `probe_sensitivities` perturbs one tensor at a time (one probe forward per
tensor: 29 minutes for SmolLM2-135M's 211 tensors, issue 30), `gradient_sensitivities` gets every tensor
from one backward pass per random output projection (129 s for SmolLM2 on a loaded 2-core machine; on the
fortunes Llama its grades are within a factor 1.4 of the perturbation grades). The careful mark uses the
latter and keeps the result in an on-disk cache (`cached_grades`, `grades_cache_dir`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from modelsec.errors import PolicyError
from modelsec.watermark.fidelity import (
    CausalLMProbe,
    ClassifierProbe,
    EncoderProbe,
    FidelityProbe,
    _load,
)

__all__ = [
    "GRADE_FLOOR",
    "cached_grades",
    "grades_cache_dir",
    "grades_from_sensitivities",
    "gradient_sensitivities",
    "probe_sensitivities",
]

GRADE_FLOOR = 0.01
_EPS = 0.01
_SEED = 20240518


def _forward(probe: FidelityProbe, model_dir: Path) -> tuple[Any, Callable[[Any], Any]] | None:
    """The module the probe runs and a function computing its outputs on the probe set (None: unsupported)."""
    import torch

    if isinstance(probe, CausalLMProbe):
        if not probe._reference:
            raise PolicyError("fidelity probe used before prepare()")
        seqs = [
            torch.cat([ids, torch.tensor([cont], dtype=ids.dtype)], dim=1) if cont else ids
            for ids, (cont, _) in zip(probe._ids, probe._reference, strict=True)
        ]
        lm = _load(model_dir, causal=True)
        return lm, lambda m: torch.cat([m(input_ids=s).logits[0] for s in seqs])
    if isinstance(probe, EncoderProbe):
        if probe._batch is None:
            raise PolicyError("fidelity probe used before prepare()")
        enc = _load(model_dir, causal=False)
        mask = probe._batch["attention_mask"].bool()
        return enc, lambda m: m(**probe._batch).last_hidden_state[mask]
    if isinstance(probe, ClassifierProbe):
        module = probe._module(model_dir)
        return module, lambda m: m(probe.inputs)
    return None


def probe_sensitivities(probe: FidelityProbe, model_dir: Path) -> dict[str, tuple[int, float]] | None:
    """`{tensor name: (elements, S_T)}` for every parameter of at least two dimensions, or None.

    Args:
        probe: A prepared `CausalLMProbe`, `EncoderProbe` or `ClassifierProbe` (others: None).
        model_dir: The unmarked model.

    Returns:
        Element counts and sensitivities (mean squared output change per unit squared relative change).

    Raises:
        PolicyError: The probe was not prepared.
        MalformedArtifactError: The model cannot be loaded.
    """
    import torch

    found = _forward(probe, model_dir)
    if found is None:
        return None
    module, run = found
    gen = torch.Generator().manual_seed(_SEED)
    out: dict[str, tuple[int, float]] = {}
    with torch.no_grad():
        reference = run(module)
        for name, p in module.named_parameters():
            if p.dim() < 2 or not p.dtype.is_floating_point:
                continue
            old = p.detach().clone()
            signs = torch.randint(0, 2, p.shape, generator=gen).to(p.dtype) * 2 - 1
            p.add_(_EPS * signs * old.abs())
            changed = run(module)
            p.copy_(old)
            out[name] = (p.numel(), float(((changed - reference) ** 2).mean()) / _EPS**2)
    return out


def grades_from_sensitivities(sens: dict[str, tuple[int, float]]) -> dict[str, float]:
    """Grades `∝ sqrt(n_T / S_T)`, largest 1, floored at `GRADE_FLOOR` (a tensor with S_T = 0 gets 1)."""
    raw = {name: (math.sqrt(n / s) if s > 0 else float("inf")) for name, (n, s) in sens.items()}
    finite = [v for v in raw.values() if v != float("inf")]
    top = max(finite) if finite else 1.0
    return {
        name: 1.0 if v == float("inf") else max(GRADE_FLOOR, min(1.0, v / top)) for name, v in raw.items()
    }


#: Random output projections of the one-pass gradient grading (Hutchinson estimator of the output change).
GRADIENT_PROJECTIONS = 2
#: Version of the grading method, part of the cache key: a change of method never reads old grades.
GRADING_METHOD = "modelsec-grades-gradient/v1"


def gradient_sensitivities(model: Any, groups: Sequence[Any], *, projections: int = GRADIENT_PROJECTIONS,
                           seed: int = _SEED) -> dict[str, tuple[int, float]]:  # fmt: skip
    """`{tensor name: (elements, S_T)}` from gradients: one backward pass per random output projection.

    `S_T` is the same quantity `probe_sensitivities` measures by perturbing one tensor at a time (mean
    squared output change per unit squared relative change under random signs), computed to first order:
    for a move `delta = eps s |w|` with random signs `s`, `E_s ||J delta||^2 = eps^2 sum_i ||J_i||^2 w_i^2`,
    and `||J_i||^2 = E_r (r . J_i)^2` for Rademacher output vectors `r` (Hutchinson 1989), so each
    projection costs one forward and one backward pass over the probe set for *all* tensors at once, instead
    of one forward pass per tensor.

    Args:
        model: The unmarked model (a `torch.nn.Module` returning `.logits`), float32.
        groups: Token groups (batch, length) of the probe set: the prompts with their unmarked continuations.
        projections: Random projections averaged (>= 1).
        seed: Seed of the projections.

    Returns:
        Element counts and sensitivities for every floating parameter of at least 2 dimensions.

    Raises:
        PolicyError: `projections < 1` or no token group.
    """
    import torch

    if projections < 1 or not groups:
        raise PolicyError(f"gradient grading needs >= 1 projection and a probe set, got {projections}")
    gen = torch.Generator().manual_seed(seed)
    params = [(n, p) for n, p in model.named_parameters() if p.dim() >= 2 and p.dtype.is_floating_point]
    was = [p.requires_grad for _, p in model.named_parameters()]
    for _, p in model.named_parameters():
        p.requires_grad_(False)
    for _, p in params:
        p.requires_grad_(True)
    acc = {n: 0.0 for n, _ in params}
    outputs = 0
    try:
        for k in range(projections):
            for _, p in params:
                p.grad = None
            for g in groups:
                logits = model(input_ids=g).logits
                if k == 0:
                    outputs += int(logits.numel())
                r = torch.randint(0, 2, logits.shape, generator=gen).to(logits.dtype) * 2 - 1
                (logits * r).sum().backward()
                del logits, r
            with torch.no_grad():
                for n, p in params:
                    if p.grad is not None:
                        acc[n] += float(((p.grad * p) ** 2).sum())
    finally:
        for (_, p), w in zip(model.named_parameters(), was, strict=True):
            p.requires_grad_(w)
            p.grad = None
    return {n: (p.numel(), acc[n] / projections / max(1, outputs)) for n, p in params}


def grades_cache_dir() -> Path:
    """The grades cache directory.

    `$MODELSEC_GRADES_CACHE`, else `$XDG_CACHE_HOME/modelsec/grades`, else `~/.cache/modelsec/grades`.
    """
    import os

    explicit = os.environ.get("MODELSEC_GRADES_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "modelsec" / "grades"


def _canonical(obj: Any) -> bytes:
    import json

    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def cached_grades(
    root_digest: str,
    settings: Mapping[str, Any],
    names: Collection[str],
    compute: Callable[[], Mapping[str, float]],
    *,
    cache_dir: Path | None = None,
) -> tuple[dict[str, float], bool]:
    """Per-tensor grades from the on-disk cache, or computed (and cached) when absent or not intact.

    The cache file is named by SHA-256 of the canonical JSON of `{method, rootDigest, settings}` and holds
    that key, the grades and a SHA-256 over both. A file is used only if it parses, its checksum matches
    (`hmac.compare_digest`), its key is exactly this one, and it grades exactly `names` with finite values in
    [GRADE_FLOOR, 1]; anything else (a truncated, edited or foreign file) is recomputed and overwritten.
    What the checksum does not stop: someone able to write the cache can write a consistent file. Grades
    only shape the mark, and the careful embedding measures the written model against the fidelity bar
    whatever the grades were, so a forged cache can make a mark refused, never accepted unmeasured.

    Args:
        root_digest: The model's root digest (hex SHA-256, `modelsec.signer.statements.model_root_digest`).
        settings: The grading settings (probe digest, projections, seed ...): JSON values.
        names: The tensor names that must be graded.
        compute: Computes the grades when the cache cannot be used.
        cache_dir: Cache directory (default `grades_cache_dir()`).

    Returns:
        The grades and whether they came from the cache.

    Raises:
        PolicyError: `compute` returned grades that do not cover `names` or are out of range.
    """
    import hashlib
    import hmac
    import json
    import os
    import tempfile

    key = {"method": GRADING_METHOD, "rootDigest": root_digest, "settings": dict(settings)}
    ident = hashlib.sha256(_canonical(key)).hexdigest()
    where = (cache_dir or grades_cache_dir()) / f"{ident}.json"
    wanted = set(names)

    def valid(grades: Any) -> bool:
        return (
            isinstance(grades, dict)
            and set(grades) == wanted
            and all(
                isinstance(v, float) and math.isfinite(v) and GRADE_FLOOR <= v <= 1.0 for v in grades.values()
            )
        )

    try:
        doc = json.loads(where.read_bytes()[: 64 << 20])
        body = {"key": doc["key"], "grades": doc["grades"]}
        if (
            hmac.compare_digest(str(doc["sha256"]), hashlib.sha256(_canonical(body)).hexdigest())
            and doc["key"] == key
            and valid(doc["grades"])
        ):
            return dict(doc["grades"]), True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    grades = {n: float(v) for n, v in compute().items() if n in wanted}
    if not valid(grades):
        raise PolicyError(f"grading did not grade every carrier tensor in [{GRADE_FLOOR}, 1]")
    body = {"key": key, "grades": grades}
    text = json.dumps({**body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}, sort_keys=True)
    try:
        where.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".grades-", dir=where.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, where)
    except OSError:
        pass  # an unwritable cache costs a regrading next time, nothing else
    return grades, False
