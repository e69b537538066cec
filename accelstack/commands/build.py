"""`accelstack build ggml`: compile a stable-diffusion.cpp runtime wheel for one backend (publishers)."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import emit
from .progress import progress_renderer


def register(sub: argparse._SubParsersAction) -> None:
    from ..publisher.build import COMPILE_TIMEOUT, VARIANTS

    p = sub.add_parser(
        "build",
        help="compile a ggml runtime wheel for one backend variant (for publishers)",
        description="Compile stable-diffusion-cpp-python for one backend variant into a py3-none wheel, "
        "cached by (source hash, options). Builds never use -march=native. Then publish a directory of "
        "builds with `accelstack manifest build DIR --base-url URL --key KEY`.",
        epilog="examples:\n  accelstack build ggml --backend cpu --out dist/cpu\n  accelstack build ggml --backend cuda --sdist ./stable_diffusion_cpp_python-0.4.7.tar.gz --out dist/cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", choices=["ggml"], help="what to build")
    p.add_argument("--backend", default="cpu", choices=sorted(VARIANTS), help="backend variant (default cpu)")
    p.add_argument("--sdist", metavar="PATH", help="stable_diffusion_cpp_python-*.tar.gz (default: downloaded from the package registry)")
    p.add_argument("--out", metavar="DIR", help="copy the wheel and its build record here")
    p.add_argument("--jobs", type=int, default=0, help="parallel compile jobs (default: all cores)")
    p.add_argument("--timeout", type=float, default=COMPILE_TIMEOUT, metavar="SECONDS",
                   help=f"stop a compile that runs longer than this (default {COMPILE_TIMEOUT:.0f})")
    p.add_argument("--json", action="store_true", help="progress as JSON lines, then a result line (docs/json.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..publisher.build import build_ggml

    with progress_renderer(json_mode=args.json) as progress:
        result = build_ggml(args.backend, sdist=Path(args.sdist) if args.sdist else None,
                            out_dir=Path(args.out) if args.out else None, jobs=args.jobs or None, progress=progress,
                            compile_timeout=args.timeout)
    how = "reused from the build cache" if result.cache_hit else f"compiled in {result.seconds:.0f} s"
    emit(args, result, f"{result.variant}: {result.wheel} ({result.size / 1e6:.1f} MB, {how})\n"
         f"  sha256 {result.sha256}\n  cmake {' '.join(result.cmake_args)}")
    return 0
