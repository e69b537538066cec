"""What is told per model family: how ``verify --family`` reports (where each family's image goes, one
report of the families' reports), and what generate checks a family's files against before any worker
starts, from stable-diffusion.cpp 0.4.7's source: the text encoders a family cannot run without, and
every tensor of an SD ControlNet."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ...limits import read_capped
from ...serde import to_dict
from ...verdict import VerifyCheck, VerifyReport
from ..errors import OutputPathError
from ..probes.architecture import Shape, _conv, _linear, _norm, _transformer
from ..probes.families import DEFAULT_FAMILY

__all__ = ["family_output", "check_family_outputs", "VERIFY_PARAMETERS", "merge_reports", "NEEDED_ENCODERS", "controlnet_tensors", "controlnet_faults"]
CONTROL_PREFIX = "control_model."  # dropped from a ControlNet's names as it loads (src/name_conversion.cpp)

# The text encoders (data/model_families.json kinds) a family's conditioner cannot do without: at least one
# of each family's (src/conditioner.hpp). FluxCLIPEmbedder (FLUX.1) and SD3CLIPEmbedder take any one, with
# zeros for the others and a warning; with none they make no condition and the first step crashes (SIGSEGV,
# measured with FLUX.1). LLMEmbedder always builds its LLM, whose missing tensors fail the load.
# T5CLIPEmbedder (Chroma, Wan) feeds zeros without T5, and UNet models are whole checkpoints: not listed.
NEEDED_ENCODERS: Dict[str, Tuple[str, ...]] = {
    "flux": ("clip-l", "t5xxl"), "sd3": ("clip-l", "clip-g", "t5xxl"),
    "z-image": ("qwen3-4b",), "qwen-image": ("qwen2.5-vl-7b",),
}


VERIFY_PARAMETERS = b"parameters\x00accelstack probe"  # the text chunk of every probe image verify writes


def family_output(output: Union[str, Path], family: str) -> Path:
    """Where a family's probe image goes: ``output`` for SD 1.x, else ``<stem>-<family><suffix>``
    beside it (``verify-cpu.png`` -> ``verify-cpu-flux.png``)."""
    out = Path(output)
    return out if family == DEFAULT_FAMILY else out.with_name(f"{out.stem}-{family}{out.suffix or '.png'}")


def check_family_outputs(output: Union[str, Path], families: Sequence[str]) -> None:
    """A family's image goes to a name the caller did not give (``x.png`` -> ``x-flux.png``): a file
    there that is not a probe image verify wrote is refused, never replaced (issue 47); an earlier
    verify's image (its parameters say ``accelstack probe``) is replaced, as ``output`` itself is."""
    for family in families:
        path = family_output(output, family)
        if path == Path(output) or not os.path.lexists(path):
            continue
        try:
            head = read_capped(path, 64 << 10)
        except OSError:
            head = b""
        if not (head.startswith(b"\x89PNG\r\n\x1a\n") and VERIFY_PARAMETERS in head):
            raise OutputPathError(f"cannot write the {family} probe image to {path}: a file verify did not write is "
                                  f"there, and only {output} was named", hint="move that file, or name another output")


def merge_reports(reports: List[Tuple[str, VerifyReport]], seconds: float) -> VerifyReport:
    """One report of the families' reports (``verify(families=...)``): the run's figures (load and
    generate times summed; one family's step, image, pixels and probe only when it is the one family:
    they are no whole run's), every family's checks named ``<family>:<check>``, each family's own
    report in ``details["families"]``."""
    first, one = reports[0][1], len(reports) == 1

    def total(name: str) -> Optional[float]:
        values = [getattr(r, name) for _f, r in reports if getattr(r, name) is not None]
        return round(sum(values), 4) if values else None

    merged = VerifyReport(ok=all(r.ok for _f, r in reports), reason="; ".join(f"{f}: {r.reason}" for f, r in reports
                                                                               if not r.ok),
                          runtime=first.runtime, backend=first.backend, device=first.device,
                          load_seconds=total("load_seconds"), step_seconds=first.step_seconds if one else None,
                          its_per_second=first.its_per_second if one else None, generate_seconds=total("generate_seconds"),
                          probe_seconds=round(sum(r.probe_seconds for _f, r in reports), 3),
                          probe_path=first.probe_path if one else "", probe_temporary=first.probe_temporary,
                          image=first.image if one else "", total_seconds=round(seconds, 4), pixels=first.pixels if one else None)
    for family, r in reports:
        merged.checks += [VerifyCheck(f"{family}:{c.name}", c.ok, c.detail) for c in r.checks]
        if r.cpu_mean_diff is not None and (merged.cpu_mean_diff is None or r.cpu_mean_diff > merged.cpu_mean_diff):
            merged.cpu_mean_diff = r.cpu_mean_diff
        if r.cpu_max_diff is not None:
            merged.cpu_max_diff = max(merged.cpu_max_diff or 0, r.cpu_max_diff)
        if not r.ok and not merged.log_tail:
            merged.log_tail = r.log_tail
    merged.details["families"] = {f: {k: v for k, v in to_dict(r).items() if k != "log_tail"} for f, r in reports}
    return merged


def controlnet_tensors(context: int) -> Dict[str, Shape]:
    """Every tensor src/control.hpp ``ControlNetBlock`` builds for an SD 1.x (``context`` 768) or SD 2.x
    (1024) UNet, in PyTorch order: model_channels 320, channel_mult (1, 2, 4, 4), two ResBlocks a level with
    a transformer on the first three, zero convolutions, the hint encoder, 1x1 convolution projections.
    Its load fails on a tensor missing or of another shape (src/model.cpp ModelLoader::load_tensors)."""
    out: Dict[str, Shape] = {}
    ch0, temb = 320, 1280
    _linear(out, "time_embed.0", temb, ch0)
    _linear(out, "time_embed.2", temb, temb)
    _conv(out, "input_blocks.0.0", ch0, 4, 3)
    _conv(out, "zero_convs.0.0", ch0, ch0, 1)
    for i, (n_out, n_in) in enumerate([(16, 3), (16, 16), (32, 16), (32, 32), (96, 32), (96, 96), (256, 96), (ch0, 256)]):
        _conv(out, f"input_hint_block.{2 * i}", n_out, n_in, 3)
    ch, idx = ch0, 0
    for level, mult in enumerate((1, 2, 4, 4)):
        for _ in range(2):
            idx += 1
            _resblock(out, f"input_blocks.{idx}.0", ch, mult * ch0, temb)
            ch = mult * ch0
            if level < 3:
                _transformer(out, f"input_blocks.{idx}.1", ch, context)
            _conv(out, f"zero_convs.{idx}.0", ch, ch, 1)
        if level < 3:
            idx += 1
            _conv(out, f"input_blocks.{idx}.0.op", ch, ch, 3)
            _conv(out, f"zero_convs.{idx}.0", ch, ch, 1)
    _resblock(out, "middle_block.0", ch, ch, temb)
    _transformer(out, "middle_block.1", ch, context)
    _resblock(out, "middle_block.2", ch, ch, temb)
    _conv(out, "middle_block_out.0", ch, ch, 1)
    return out


def _resblock(out: Dict[str, Shape], name: str, n_in: int, n_out: int, emb: int) -> None:
    """src/common_block.hpp ResBlock, in the original (LDM) names."""
    _norm(out, f"{name}.in_layers.0", n_in)
    _conv(out, f"{name}.in_layers.2", n_out, n_in, 3)
    _linear(out, f"{name}.emb_layers.1", n_out, emb)
    _norm(out, f"{name}.out_layers.0", n_out)
    _conv(out, f"{name}.out_layers.3", n_out, n_out, 3)
    if n_in != n_out:
        _conv(out, f"{name}.skip_connection", n_out, n_in, 1)


def controlnet_faults(shapes: Dict[str, Sequence[int]], context: int) -> str:
    """What keeps a ControlNet's tensors (name: PyTorch shape) from loading as :func:`controlnet_tensors`
    (``context`` wide): tensors of another shape, then missing ones ("" when none). Tensors it does not
    build are ignored, as the load does ("unknown tensor")."""
    have = {n[len(CONTROL_PREFIX):] if n.startswith(CONTROL_PREFIX) else n: tuple(s) for n, s in shapes.items()}
    want = controlnet_tensors(context)
    said = [f"{n} is {list(have[n])}, not {list(s)}" for n, s in want.items() if n in have and not _same(have[n], s)][:2]
    lacks = [n for n in want if n not in have]
    if lacks:
        said.append(f"it lacks {', '.join(lacks[:3])}{' and more' if len(lacks) > 3 else ''}")
    return "; ".join(said) + (" (src/control.hpp ControlNetBlock builds each tensor with a fixed shape; a missing one or "
                              "another shape fails the load, src/model.cpp load_tensors)" if said else "")


def _same(a: Tuple[int, ...], b: Tuple[int, ...]) -> bool:
    """Whether stable-diffusion.cpp takes shape ``a`` for ``b``: it compares ggml's four dimensions
    (src/model.cpp load_tensors), so leading 1s of a PyTorch shape do not count."""
    return len(a) <= 4 and len(b) <= 4 and (1,) * (4 - len(a)) + a == (1,) * (4 - len(b)) + b
