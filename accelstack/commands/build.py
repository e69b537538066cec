"""`accelstack build ggml`: compile a stable-diffusion.cpp runtime wheel for one backend (publishers)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

from ..core.building import (
    COMPILE_TIMEOUT,
    CUDA_ARCHS_ENV,
    CUDA_COMPILE_TIMEOUT_PER_ARCH,
    CUDA_VARIANTS,
    VARIANTS,
    build_ggml,
    parse_cuda_archs,
)
from ..errors import UsageError
from ..serde import size_text
from .common import emit, settings_from_args
from .progress import progress_renderer

__all__ = ["register", "cuda_archs_of", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="compile a ggml runtime wheel for one backend variant (for publishers)",
        description="Compile stable-diffusion-cpp-python for one backend variant into a py3-none wheel, "
        "cached by (source hash, options). Builds never use -march=native. Then publish a directory of "
        "builds with `accelstack manifest build DIR --base-url URL --key KEY`.",
        epilog="examples:\n  accelstack build ggml --backend cpu --out dist/cpu\n"
               "  accelstack build ggml --backend cuda --sdist ./stable_diffusion_cpp_python-0.4.7.tar.gz --out dist/cuda\n"
               "  accelstack build ggml --backend cuda --cuda-arch 86,89 --out dist/cuda-ampere-ada",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", choices=["ggml"], help="what to build")
    p.add_argument("--backend", default="cpu", choices=sorted(VARIANTS), help="backend variant (default cpu)")
    p.add_argument("--sdist", metavar="PATH", help="stable_diffusion_cpp_python-*.tar.gz (default: downloaded from the package registry)")
    p.add_argument("--out", metavar="DIR", help="copy the wheel and its build record here")
    p.add_argument("--cuda-arch", metavar="SM[,SM]",
                   help="CUDA variants: compile only these GPU architectures, e.g. 86 or 86,89 (default: "
                        f"{CUDA_ARCHS_ENV}, else every one the toolkit supports; each adds over an hour on 2 cores)")
    p.add_argument("--jobs", type=int, default=0, help="parallel compile jobs (default: all cores)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"stop a compile that runs longer than this (default {COMPILE_TIMEOUT:.0f}; a CUDA build "
                   f"{CUDA_COMPILE_TIMEOUT_PER_ARCH:.0f} for each architecture it compiles)")
    p.add_argument("--json", action="store_true", help="progress as JSON lines, then a result line (docs/json.md)")
    p.set_defaults(func=run)


def cuda_archs_of(args: argparse.Namespace) -> Optional[List[str]]:
    """The architectures ``--cuda-arch`` names (None without it), parsed as ACCELSTACK_CUDA_ARCHS is;
    a usage error for a variant that compiles no CUDA or for something that is not an architecture."""
    if args.cuda_arch is None:
        return None
    if args.backend not in CUDA_VARIANTS:
        raise UsageError(f"--cuda-arch narrows a CUDA build; the {args.backend} variant compiles no CUDA",
                         f"use it with --backend {' or --backend '.join(CUDA_VARIANTS)}, or leave it out")
    try:
        return parse_cuda_archs(args.cuda_arch, "--cuda-arch")
    except ValueError as exc:
        raise UsageError(str(exc), "give compute capabilities: 86 (or 8.6, sm_86) for compute capability 8.6; "
                         "`accelstack detect` shows each GPU's") from None


def run(args: argparse.Namespace) -> int:
    archs = cuda_archs_of(args)  # refused before any download or progress output
    with progress_renderer(json_mode=args.json) as progress:
        result = build_ggml(args.backend, settings_from_args(args), sdist=Path(args.sdist) if args.sdist else None,
                            out_dir=Path(args.out) if args.out else None, jobs=args.jobs or None, progress=progress,
                            compile_timeout=args.timeout, cuda_archs=archs)
    how = "reused from the build cache" if result.cache_hit else f"compiled in {result.seconds:.0f} s"
    emit(args, result, f"{result.variant}: {result.wheel} ({size_text(result.size)}, {how})\n"
         f"  sha256 {result.sha256}\n  cmake {' '.join(result.cmake_args)}")
    return 0
