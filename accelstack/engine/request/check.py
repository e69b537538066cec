"""A generate request checked once, before any worker starts: what the engine then runs as it is.

The CLI, the service and the library build one typed :class:`GenerateRequest` and make one check
call, :func:`check_generation`: the request's values and the engine's options, the output paths
(usable, and none of them an input of the run), the stack's support for LoRAs and embeddings, and
then the model's and component files' headers and the input images. The result is a
:class:`CheckedGeneration`, which :func:`accelstack.engine.generation.generate` runs without
checking again; the worker still validates what reaches it, as any process boundary does.

The files are read in a second step (:meth:`CheckedGeneration.read_files`) so that the CLI can
start its worker between the two: a wrong argument is refused before any process starts, and the
worker imports the runtime while the headers are read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

from ..config import EngineOptions
from ..errors import InvalidRequestError
from ..runtime import GGML, StackTraits
from ..worker.protocol import GenerateRequest
from .outputs import check_not_inputs, check_outputs, output_paths

if TYPE_CHECKING:
    from .components import CheckedComponents

__all__ = ["CheckedGeneration", "check_generation"]


@dataclass
class CheckedGeneration:
    """A request, its options and its outputs, checked for one stack (``traits``); ``components`` is
    what the model's and component files' check found (None until :meth:`read_files`)."""

    request: GenerateRequest
    options: EngineOptions
    model: Optional[str]
    output: str
    outputs: List[Path]
    traits: StackTraits
    components: Optional[CheckedComponents] = None
    warnings: List[str] = field(default_factory=list)  # what the run lacks but can do without (engine.request.needs)

    def read_files(self) -> CheckedGeneration:
        """The model, each component file and each input image, checked against the model's family."""
        if self.components is None:
            # the model checks load with their first use: the CLI's worker starts before they are imported
            from . import components, defaults, images, needs, sizes

            found = components.check_components(self.request, self.model, components_supported=self.traits.companions,
                                                library=self.traits.library)
            found.mask_rgb, found.ref_rgb = images.check_edit_images(self.request, found, self.traits.library,
                                                                     self.traits.companions)
            images.check_encoder(self.request, self.model, found)  # what encodes the init/reference images
            if self.traits.family_rules:  # the size the family makes exactly, or a refusal: never a silently larger image
                sizes.check_size(self.request, found.family)
                self.warnings = needs.companion_warnings(self.request, self.model or "", found)
            # what the request left out: the family's reference settings (shipped data, typed when read); a value given wins
            self.request = defaults.apply_defaults(self.request, found.family, family_rules=self.traits.family_rules)
            self.components = found
        return self

    def files(self) -> CheckedComponents:
        return self.read_files().components  # type: ignore[return-value]  # read_files sets it


def check_generation(request: GenerateRequest, model: Optional[Union[str, Path]], output: Union[str, Path],
                     options: Optional[EngineOptions] = None, *, traits: StackTraits = GGML,
                     read_files: bool = True) -> CheckedGeneration:
    """The one check of a generate request for a runtime of ``traits``: a typed error, before any
    work, for anything that would fail later; ``read_files=False`` leaves the files for
    :meth:`CheckedGeneration.read_files`."""
    request.validate()
    opts = (options or EngineOptions()).validate()
    name = str(model) if model else None
    # bad outputs fail before the model loads; one that is an input would overwrite it
    outputs = check_not_inputs(check_outputs(output_paths(output, request.batch_count)), request, name)
    if (request.lora_dir or request.embeddings_dir) and not traits.companions:
        raise InvalidRequestError(f"LoRAs and embeddings are not supported on the {traits.library} stack",
                                  hint="generate with a stable-diffusion.cpp runtime, or leave out the LoRA and "
                                  "embeddings folders")
    checked = CheckedGeneration(request, opts, name, str(output), outputs, traits)
    return checked.read_files() if read_files else checked
