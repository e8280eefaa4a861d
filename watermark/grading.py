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
"""

from __future__ import annotations

import math
from collections.abc import Callable
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

__all__ = ["GRADE_FLOOR", "grades_from_sensitivities", "probe_sensitivities"]

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
