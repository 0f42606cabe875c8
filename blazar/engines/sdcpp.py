"""The `sdcpp` lane: stable-diffusion.cpp's `sd-server`, built from a PyPI sdist.

`stable-diffusion-cpp-python` publishes no Linux wheel with the server in it, but its
sdist (20 MB for 0.4.7) vendors the whole stable-diffusion.cpp tree, `examples/server`
included. `build_sd_server` unpacks that sdist, runs cmake on the vendored tree for the
`sd-server` target only (Release, CPU, portable: `GGML_NATIVE=OFF` as the llama.cpp
lanes, no WebP/WebM, no web frontend: pnpm is not at hand and Blazar has its own
dashboard), checks that the binary starts (`--version`), and publishes it with the lane's
launcher (`launchers/sd_launcher.py`, which owns the `sd-server` child and gives it the
contract every lane has: `/health`, the `listening on` line, SIGTERM) as engine
`<engines>/sdcpp/sdcpp-<version>-cpu/`. A CPU build of that one target took about
14 minutes on two busy cores here (the figure is in docs/engines.md).

A tag already built is reused, never rebuilt: the Makefile's `sd-server` target builds
it once into the tests' cache (`~/.cache/blazar-tests/engines`), so tests and CI build
it once; `install_sdcpp(..., built=DIR)` installs a copy of such a build instead of
building again. The engine's command is this Python running the launcher (standard
library only, like every launcher).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from blazar.engines import launchers
from blazar.engines.base import InstalledEngine, publish, staging
from blazar.engines.source import (
    CudaInfo,
    Runner,
    SourceBuildError,
    _run,
    _tail,
    cuda_flags,
    detect_cuda,
    run_cmake,
)
from blazar.errors import InvalidInput
from reconcilers.engines import sdcpp_tag
from specs.engines import SDCPP_PINNED, SOURCE_ENGINES

KIND = "sdcpp"
PACKAGE = SOURCE_ENGINES[KIND]  # stable-diffusion-cpp-python
PINNED = SDCPP_PINNED  # the sdist checked here (0.4.7): its vendored tree has examples/server
SERVER = "sd-server"
LAUNCHER = "sd_launcher.py"
VENDORED = Path("vendor") / "stable-diffusion.cpp"
# cmake flags: portable CPU code, no optional media codecs, no web frontend.
FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # native builds fault (SIGILL) on this VM, as for llama.cpp
    "-DBUILD_SHARED_LIBS=OFF",
    "-DSD_BUILD_SHARED_LIBS=OFF",
    "-DSD_BUILD_EXAMPLES=ON",
    "-DSD_WEBP=OFF",
    "-DSD_WEBM=OFF",
    "-DSD_SERVER_BUILD_FRONTEND=OFF",
)


def engine_tag(version: str, backend: str = "cpu") -> str:
    """sdcpp-0.4.7-cpu: the sdist's version names the vendored tree."""
    return sdcpp_tag(version, backend)


def sdist_name(version: str) -> str:
    return f"stable_diffusion_cpp_python-{version}.tar.gz"


def cmake_commands(
    source_dir: Path,
    build_dir: Path,
    *,
    backend: str = "cpu",
    jobs: int | None = None,
    cuda: CudaInfo | None = None,
) -> list[list[str]]:
    """[configure, build] for the sd-server target of the vendored tree; a cuda build
    takes the toolkit `detect_cuda` found (nvcc, host compiler, the GPUs' architectures),
    as the llama.cpp source builds do."""
    if backend not in ("cpu", "cuda"):
        raise InvalidInput(f"unknown backend {backend!r}: choose cpu or cuda")
    configure = ["cmake", "-S", str(source_dir), "-B", str(build_dir), *FLAGS]
    if backend == "cuda":
        configure += cuda_flags("SD_CUDA", cuda)
    build = ["cmake", "--build", str(build_dir), "--target", SERVER, "-j", str(jobs or 2)]
    return [configure, build]


def fetch_sdist(cache: Path, version: str, runner: Runner = subprocess.run) -> Path:
    """The sdist from `cache`, or downloaded into it with pip (sources only, no deps)."""
    path = cache / sdist_name(version)
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    done = _run(
        runner,
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "-d",
            str(cache),
            f"{PACKAGE}=={version}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not path.is_file():
        said = f"{done.stdout or ''}{done.stderr or ''}"
        raise SourceBuildError(
            f"could not download the {PACKAGE} {version} sdist:\n{_tail(said, 8)}"
        )
    return path


def unpack(sdist: Path, work_dir: Path) -> Path:
    """The vendored stable-diffusion.cpp tree of the sdist, unpacked under `work_dir`."""
    from blazar import archives

    top = Path(tempfile.mkdtemp(prefix="unpack-", dir=work_dir))
    then = "nothing was built: check where the sdist came from"
    archives.extract(sdist, top, limits=archives.SOFTWARE, then=then)
    found = [d / VENDORED for d in top.iterdir() if (d / VENDORED / "CMakeLists.txt").is_file()]
    if not found:
        raise SourceBuildError(f"{sdist.name} holds no {VENDORED} tree")
    return found[0]


def check_server(binary: Path, runner: Runner = subprocess.run) -> str:
    """What `sd-server --version` prints; a SourceBuildError when it does not start."""
    done = _run(runner, [str(binary), "--version"], capture_output=True, text=True, timeout=60)
    said = f"{done.stdout or ''}{done.stderr or ''}".strip()
    if done.returncode != 0 or "stable-diffusion" not in said.lower():
        raise SourceBuildError(f"{binary} does not run as sd-server:\n{_tail(said, 8)}")
    return said.splitlines()[-1] if said else ""


def _engine(final: Path, tag: str, version: str, backend: str) -> InstalledEngine:
    return InstalledEngine(
        kind=KIND,
        tag=tag,
        method="source",
        version=version,
        path=final,
        command=[sys.executable, str(final / LAUNCHER)],
        details={"backend": backend, "server": str(final / SERVER)},
    )


def built(engines_root: Path, version: str = PINNED, backend: str = "cpu") -> Path | None:
    """An sd-server of that version already built under `engines_root`, if any."""
    path = engines_root / KIND / engine_tag(version, backend) / SERVER
    return path if path.is_file() else None


def build_sd_server(
    engines_root: Path,
    sdist: Path,
    version: str,
    *,
    work_dir: Path,
    backend: str = "cpu",
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    runner: Runner = subprocess.run,
) -> InstalledEngine:
    """Build sd-server from the sdist's vendored tree and publish it as an sdcpp engine
    (a tag built before is returned as it is)."""
    say = log or (lambda _msg: None)
    tag = engine_tag(version, backend)
    final = engines_root / KIND / tag
    if (final / SERVER).is_file():
        say(f"{SERVER} {tag} is built already: {final / SERVER}")
        return _engine(final, tag, version, backend)
    work_dir.mkdir(parents=True, exist_ok=True)
    tree = unpack(sdist, work_dir)
    build_dir = work_dir / "build-sd-server"
    log_path = work_dir / "build-sd-server.log"
    cuda = detect_cuda(runner=runner) if backend == "cuda" else None
    commands = cmake_commands(tree, build_dir, backend=backend, jobs=jobs, cuda=cuda)
    run_cmake(commands, log_path, f"{SERVER} from {sdist.name}", say, runner)
    made = build_dir / "bin" / SERVER
    if not made.is_file():
        raise SourceBuildError(f"the build finished but made no {made}")
    return publish_server(engines_root, made, version, backend, log_path, runner)


def publish_server(
    engines_root: Path,
    binary: Path,
    version: str,
    backend: str = "cpu",
    build_log: Path | None = None,
    runner: Runner = subprocess.run,
) -> InstalledEngine:
    """Install a built sd-server binary, with its launcher, as engine sdcpp-VERSION-BACKEND."""
    tag = engine_tag(version, backend)
    with staging(engines_root, tag, KIND) as (tmp, final):
        shutil.copy2(binary, tmp / SERVER)
        shutil.copy2(launchers.FOLDER / LAUNCHER, tmp / LAUNCHER)
        shutil.copy2(launchers.COMMON, tmp / launchers.COMMON.name)
        if build_log is not None and build_log.is_file():
            shutil.copy2(build_log, tmp / "build.log")
        said = check_server(tmp / SERVER, runner)
        (tmp / "VERSION").write_text(f"{said}\n", encoding="utf-8")
        publish(tmp, final)
    return _engine(final, tag, version, backend)


def install_sdcpp(
    engines_root: Path,
    src_cache: Path,
    version: str = PINNED,
    *,
    built_root: Path | None = None,
    backend: str = "cpu",
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
) -> InstalledEngine:
    """`engine install --kind sdcpp`: a copy of a build under `built_root` (the tests'
    cache, $BLAZAR_SDCPP_BUILT) when it holds this tag, else a build of the sdist."""
    say = log or (lambda _msg: None)
    if built_root is not None and (found := built(built_root, version, backend)) is not None:
        say(f"installing the {SERVER} built before at {found}")
        return publish_server(engines_root, found, version, backend, found.parent / "build.log")
    sdist = fetch_sdist(src_cache, version)
    work = Path(tempfile.mkdtemp(prefix="build-sdcpp-", dir=src_cache))
    try:
        say(f"building {SERVER} ({backend}) from {sdist.name}; minutes on a few cores")
        return build_sd_server(
            engines_root, sdist, version, work_dir=work, backend=backend, jobs=jobs, log=say
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
