"""Issue 42, decisions real machines still trip: one reasoning for both stacks, sourced GPU facts."""
from __future__ import annotations

from ._factory import plan_of, replay

PYTHON = "3.11"


# -- Windows: NVIDIA's driver is installed, its version could not be read: one machine, one reasoning -----

def test_an_unread_driver_gets_the_same_reasoning_from_the_ggml_plan_as_from_the_torch_plan():
    report = replay("i11d-windows-rtx4060-laptop-partial-wmi")
    torch = plan_of(report, "torch", python=PYTHON)
    ggml = plan_of(report, "ggml", python=PYTHON)
    assert (torch.backend, torch.gpus) == ("cuda", [1])
    assert (ggml.backend, ggml.variant, ggml.gpus) == ("cuda", "win-x64-cuda12", [1])  # the NVIDIA card's CUDA, as torch plans
    for plan in (torch, ggml):
        assert any("could not be read" in n and "oldest driver" in n for n in plan.notes), plan.notes
        chosen = plan.chosen
        assert chosen is not None and "device check" in chosen.reason
    assert not any(c.code == "api" and c.backend == "cuda" for c in ggml.candidates)
    assert not any(c.name == "local-cuda" for c in ggml.candidates)  # no "reported no CUDA version" beside the chosen CUDA build
