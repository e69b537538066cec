"""A model's headers are classified once while they are unchanged (issue 46: a warm session's per-image
overhead). One generate job inspected its model three times (the request's check twice, the memory
planner's companion check once), each classifying every tensor name against the family rules: ~10-30 ms
a time on the SD 1.x probe, paid again by every job of a warm session. Rewritten headers are classified again,
and a caller that amends its inspection never changes the next caller's."""
from __future__ import annotations

import model_specs as m

from accelstack.engine.models import inspection
from accelstack.engine.models.inspection import inspect_model


def _counted(monkeypatch):
    calls = []
    real = inspection._inspect

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(inspection, "_inspect", counted)
    return calls


def test_the_same_headers_are_classified_once_and_changed_ones_again(tmp_path, monkeypatch):
    calls = _counted(monkeypatch)
    path = m.write_safetensors(tmp_path / "model.safetensors", m.flux("dev"))
    first = inspect_model(path)
    for _ in range(3):
        again = inspect_model(path)
        assert again == first and again is not first
    assert len(calls) == 1
    m.write_safetensors(path, m.chroma())  # rewritten in place: same name, another family
    assert inspect_model(path).family == "chroma" and len(calls) == 2


def test_an_amended_inspection_does_not_change_the_next(tmp_path):
    path = m.write_safetensors(tmp_path / "model.safetensors", m.flux("dev"))
    first = inspect_model(path)
    first.evidence.append("amended by a caller")
    first.needs.clear()
    second = inspect_model(path)
    assert "amended by a caller" not in second.evidence and second.needs
