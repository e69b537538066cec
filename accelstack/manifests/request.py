"""The user's request, checked: a known stack, a Python version, PEP 508 requirements.

Requirements on the torch family (torch, torchvision, torchaudio) narrow the choice of build;
the others are passed through to pip as written.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet

from ..errors import UsageError
from .hw_rules import CUDA_DRIVER_RULES
from .plan import STACKS, Request

__all__ = ["TORCH_FAMILY", "TORCH_PACKAGE", "Requirements", "check_request", "parse_requirements"]

TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
TORCH_PACKAGE = TORCH_FAMILY[0]  # the package the matrix's releases are of; the others are its companions


@dataclass
class Requirements:
    """The user's requirements, split into what narrows the torch choice and what is passed through."""

    specs: Dict[str, SpecifierSet] = field(default_factory=dict)  # torch family name -> specifier
    texts: Dict[str, str] = field(default_factory=dict)  # name -> the requirement as the user wrote it
    others: List[str] = field(default_factory=list)  # other packages, installed from PyPI as given


def parse_requirements(texts: Sequence[str]) -> Requirements:
    out = Requirements()
    for text in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"requirement {text!r} is not valid ({exc})", "write it like torch==2.6.* or 'torchvision<0.22'") from None
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in TORCH_FAMILY and not req.url:
            prev = out.specs.get(name)
            out.specs[name] = req.specifier if prev is None else prev & req.specifier
            out.texts[name] = text if name not in out.texts else f"{out.texts[name]}, {text}"
        else:
            out.others.append(text)
    return out


def check_request(request: Request) -> Requirements:
    if request.stack not in STACKS:
        raise UsageError(f"unknown stack {request.stack!r}", f"use one of: {', '.join(STACKS)}")
    if request.python and not re.match(r"^\d+\.\d+(\.\d+)?$", request.python.strip()):
        raise UsageError(f"the target Python version {request.python!r} is not a Python version", "write it like 3.11")
    if request.cuda_driver and request.cuda_driver not in CUDA_DRIVER_RULES:
        raise UsageError(f"unknown CUDA driver policy {request.cuda_driver!r}", f"use one of: {', '.join(CUDA_DRIVER_RULES)}")
    return parse_requirements(request.requirements)
