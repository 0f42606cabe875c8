"""The `source` install method: build llama.cpp's `llama-server` with cmake.

`blazar engine build cpu|cuda [--source SPEC]` calls `build_source`. SPEC is a
llama.cpp checkout (a directory), a tar archive that holds one (such as the
llama-cpp-python sdist, which vendors it under `vendor/llama.cpp`), or a git URL
with an optional `@ref`. Decisions are pure and tested with tables
(`cmake_args`, `engine_tag`, `pick_host_compiler`); effects go through an
injectable `runner` with `subprocess.run`'s signature.

Tags: llama.cpp numbers its builds by `git rev-list --count HEAD`, so a full
git history gives `b<count>-<backend>`, as does an exact `b<N>` tag or a tree
directory named like `llama.cpp-b<N>`. A shallow clone (the sdist's vendored
tree is one: its count is 1) or a tree without git has no build number; it is
tagged `b0-<backend>-<short commit, or 'local'>` and configured with
LLAMA_BUILD_NUMBER=0, so `llama-server --version` does not claim a wrong build.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blazar import archives, urls
from blazar.engines.base import KIND, InstalledEngine, lane_dir, publish, staging
from blazar.errors import AlreadyExists, BlazarError, InvalidInput

Runner = Callable[..., subprocess.CompletedProcess[Any]]
BACKENDS = ("cpu", "cuda")
# GGML_NATIVE=OFF keeps the build portable: a native build on this VM used the AMX
# instructions it advertises but faults on (SIGILL loading a Q8_0 model). Static
# libraries, because GGML_CPU_ALL_VARIANTS needs GGML_BACKEND_DL, which needs shared ones.
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # ON downloads the web UI at build time
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
# Newest gcc major each CUDA release accepts (crt/host_config.h: "gcc versions later
# than N are not supported"), keyed by the first CUDA version with that limit; used
# when nvcc's own header cannot be read.
GCC_CAPS = {
    (11, 0): 9,
    (11, 1): 10,
    (11, 4): 11,
    (12, 0): 12,
    (12, 4): 13,
    (12, 8): 14,
    (13, 0): 15,
}
_GIT_URL = re.compile(r"^(https?|git|ssh|file)://|^[\w.-]+@[\w.-]+:")
_BUILD_IN_NAME = re.compile(r"(?:^|[-_.])b(\d+)$")


class SourceBuildError(BlazarError):
    """Fetching, configuring, building or checking a llama.cpp source tree failed."""


@dataclass(frozen=True)
class SourceTree:
    root: Path  # the llama.cpp top directory (CMakeLists.txt, include/llama.h)
    spec: str  # what the user asked for
    commit: str | None  # short sha, when the tree is a git checkout
    build_number: int | None  # None when it cannot be known (shallow clone, no git)


@dataclass(frozen=True)
class CudaInfo:
    nvcc: str
    version: tuple[int, int]
    archs: tuple[str, ...]  # ("86", "89"); empty: let ggml choose its portable list
    host_compiler: str


def _run(runner: Runner, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    try:
        return runner(list(cmd), **kwargs)
    except FileNotFoundError as exc:
        raise SourceBuildError(f"{cmd[0]} is not installed: install it and try again") from exc


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_cmake(
    commands: Sequence[Sequence[str]],
    log_path: Path,
    what: str,
    say: Callable[[str], None],
    runner: Runner,
) -> None:
    """cmake's configure and build steps (`cmake_args`), their output in `log_path`; a
    step that fails is a SourceBuildError naming `what` was built and the log's tail."""
    with log_path.open("w", encoding="utf-8") as out:
        for step, cmd in zip(("configure", "build"), commands, strict=True):
            say(f"{step}: {' '.join(cmd)} (log: {log_path})")
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            done = _run(runner, cmd, stdout=out, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                out.close()
                raise SourceBuildError(
                    f"cmake {step} of {what} failed with exit code {done.returncode}; "
                    f"last lines of {log_path}:\n{_tail(log_path.read_text(errors='replace'))}"
                )


def _git(runner: Runner, root: Path, *args: str) -> str | None:
    try:
        done = runner(["git", "-C", str(root), *args], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return str(done.stdout).strip() if done.returncode == 0 else None


def is_llama_root(path: Path) -> bool:
    server = (path / "tools" / "server").is_dir() or (path / "examples" / "server").is_dir()
    return (
        (path / "CMakeLists.txt").is_file() and (path / "include" / "llama.h").is_file() and server
    )


def find_llama_root(top: Path, max_depth: int = 4) -> Path | None:
    """The shallowest llama.cpp tree at or below `top` (breadth first)."""
    level = [top]
    for _ in range(max_depth + 1):
        for path in level:
            if is_llama_root(path):
                return path
        level = sorted(
            child
            for path in level
            for child in path.iterdir()
            if child.is_dir() and not child.is_symlink() and child.name not in (".git", "build")
        )
    return None


def build_info(root: Path, runner: Runner = subprocess.run) -> tuple[str | None, int | None]:
    """(short commit, build number) of a tree, as llama.cpp's cmake would see them."""
    top = _git(runner, root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():  # no git, or a parent's repo
        match = _BUILD_IN_NAME.search(root.name)
        return None, int(match.group(1)) if match else None
    commit = _git(runner, root, "rev-parse", "--short=7", "HEAD")
    tag = _git(runner, root, "describe", "--tags", "--exact-match", "--match", "b[0-9]*")
    if tag and (match := re.fullmatch(r"b(\d+)", tag)):
        return commit, int(match.group(1))
    if _git(runner, root, "rev-parse", "--is-shallow-repository") != "false":
        return commit, None  # a shallow history's count is not the build number
    count = _git(runner, root, "rev-list", "--count", "HEAD")
    return commit, int(count) if count and count.isdigit() else None


def split_ref(spec: str) -> tuple[str, str | None]:
    """URL@ref -> (URL, ref); the '@' of git@host:path or user@host is not a ref."""
    match = re.fullmatch(r"(.+)@([^/:@]+)", spec)
    return (match.group(1), match.group(2)) if match else (spec, None)


def _clone(spec: str, work_dir: Path, runner: Runner) -> Path:
    url, ref = split_ref(spec)
    if url.partition("://")[0].lower() in urls.WEB:  # git dials the host as yarl reads it
        url = urls.target(url, credentials=True).url
    dest = Path(tempfile.mkdtemp(prefix="git-", dir=work_dir))
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    # Full commit history (the build number is its length), file contents on demand.
    cmd = ["git", "clone", "--quiet", "--filter=blob:none", "--no-checkout", url, str(dest)]
    done = _run(runner, cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SourceBuildError(
            f"git clone {url} failed:\n{_tail(done.stderr or '', 8)}\n"
            "check the URL and that this machine can reach it"
        )
    cmd = ["git", "-C", str(dest), "checkout", "--quiet", "--force", "--detach", ref or "HEAD"]
    done = _run(runner, cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise InvalidInput(
            f"{url} has no ref {ref!r}:\n{_tail(done.stderr or '', 4)}\n"
            "give an existing commit sha or tag after '@', e.g. @b11549"
        )
    return dest


def resolve_source(spec: str, work_dir: Path, *, runner: Runner = subprocess.run) -> SourceTree:
    """Find (unpacking or cloning into `work_dir` when needed) the llama.cpp tree `spec` names."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = Path(spec).expanduser()
    if path.is_dir():
        top = path
    elif path.is_file():
        if archives.kind(path) != "tar":
            raise InvalidInput(f"{spec} is not a directory or a tar archive of a llama.cpp tree")
        top = Path(tempfile.mkdtemp(prefix="unpack-", dir=work_dir))
        then = "nothing was built: check where the archive came from, or give a checkout"
        archives.extract(path, top, limits=archives.SOFTWARE, then=then)
    elif _GIT_URL.match(spec):
        top = _clone(spec, work_dir, runner)
    else:
        raise InvalidInput(f"{spec} does not exist and is not a git URL (https://, file://, ...)")
    root = find_llama_root(top)
    if root is None:
        raise InvalidInput(
            f"no llama.cpp source tree in {spec}: expected a directory with CMakeLists.txt, "
            "include/llama.h and tools/server (or examples/server)"
        )
    root = root.resolve()
    commit, build = build_info(root, runner)
    return SourceTree(root=root, spec=spec, commit=commit, build_number=build)


def engine_tag(tree: SourceTree, backend: str) -> str:
    """b11549-cpu; b0-cpu-0c1e570 (or b0-cpu-local) when the build number is unknown."""
    if tree.build_number is not None:
        return f"b{tree.build_number}-{backend}"
    return f"b0-{backend}-{tree.commit or 'local'}"


def parse_nvcc_version(text: str) -> tuple[int, int] | None:
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gcc_cap(cuda: tuple[int, int]) -> int | None:
    """Newest gcc major nvcc `cuda` accepts; None for a CUDA older than 11."""
    caps = [cap for since, cap in sorted(GCC_CAPS.items()) if cuda >= since]
    return caps[-1] if caps else None


def header_gcc_cap(nvcc: str, cuda_home: str) -> int | None:
    """The gcc limit nvcc's own crt/host_config.h states, when the header is there."""
    for top in (Path(nvcc).resolve().parent.parent, Path(cuda_home)):
        for header in [top / "include", *sorted(top.glob("targets/*/include"))]:
            with contextlib.suppress(OSError):
                text = (header / "crt" / "host_config.h").read_text(errors="replace")
                if match := re.search(r"#if __GNUC__ > (\d+)", text):
                    return int(match.group(1))
    return None


def pick_host_compiler(
    cuda: tuple[int, int], compilers: dict[int, str], cap: int | None = None
) -> str:
    """The newest installed g++ (major -> path) that nvcc `cuda` accepts."""
    cap = cap or gcc_cap(cuda)
    if cap is None:
        raise SourceBuildError(f"CUDA {cuda[0]}.{cuda[1]} is too old: install CUDA 12 or newer")
    fitting = [major for major in compilers if major <= cap]
    if not fitting:
        found = ", ".join(f"g++ {m}" for m in sorted(compilers)) or "no g++"
        raise SourceBuildError(
            f"nvcc {cuda[0]}.{cuda[1]} needs g++ {cap} or older as its host compiler, "
            f"found {found}: install one (e.g. `apt-get install g++-{cap}`)"
        )
    return compilers[max(fitting)]


def cuda_archs(caps: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    return tuple(sorted({f"{major}{minor}" for major, minor in caps}, key=int))


def nvml_compute_caps() -> list[tuple[int, int]]:
    """Compute capabilities of the GPUs NVML sees; [] without NVML or GPUs."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        caps = [pynvml.nvmlDeviceGetCudaComputeCapability(h) for h in handles]
        return [(int(major), int(minor)) for major, minor in caps]
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def detect_cuda(
    *,
    runner: Runner = subprocess.run,
    which: Callable[[str], str | None] = shutil.which,
    compute_caps: Callable[[], list[tuple[int, int]]] = nvml_compute_caps,
    cuda_home: str | None = None,
) -> CudaInfo | None:
    """nvcc, its version, the GPUs' architectures and a host compiler; None without nvcc."""
    env = os.environ
    home = cuda_home or env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda"
    nvcc = which("nvcc") or which(f"{home}/bin/nvcc")
    if nvcc is None:
        return None
    done = _run(runner, [nvcc, "--version"], capture_output=True, text=True)
    version = parse_nvcc_version(done.stdout or "") if done.returncode == 0 else None
    if version is None:
        raise SourceBuildError(f"`{nvcc} --version` did not name a CUDA release")
    caps = compute_caps()
    if not caps and (smi := which("nvidia-smi")):
        cmd = [smi, "--query-gpu=compute_cap", "--format=csv,noheader"]
        done = _run(runner, cmd, capture_output=True, text=True)
        found = re.findall(r"^\s*(\d+)\.(\d+)\s*$", done.stdout or "", re.MULTILINE)
        caps = [(int(a), int(b)) for a, b in found] if done.returncode == 0 else []
    compilers = {n: path for n in range(7, 21) if (path := which(f"g++-{n}"))}
    if (gxx := which("g++")) is not None:
        done = _run(runner, [gxx, "-dumpversion"], capture_output=True, text=True)
        major = (done.stdout or "").strip().split(".")[0]
        if done.returncode == 0 and major.isdigit():
            compilers.setdefault(int(major), gxx)
    host = pick_host_compiler(version, compilers, header_gcc_cap(nvcc, home))
    return CudaInfo(nvcc=nvcc, version=version, archs=cuda_archs(caps), host_compiler=host)


def cuda_flags(switch: str, cuda: CudaInfo | None) -> list[str]:
    """The configure flags of a cuda build with the toolkit `detect_cuda` found (nvcc, its
    host compiler, the GPUs' architectures); `switch` is the project's own option
    (llama.cpp's GGML_CUDA, stable-diffusion.cpp's SD_CUDA)."""
    if cuda is None:
        raise InvalidInput("a cuda build needs nvcc: install the CUDA toolkit")
    flags = [
        f"-D{switch}=ON",
        f"-DCMAKE_CUDA_COMPILER={cuda.nvcc}",
        f"-DCMAKE_CUDA_HOST_COMPILER={cuda.host_compiler}",
    ]
    if cuda.archs:
        flags.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(cuda.archs)}")
    return flags


def cmake_args(
    backend: str,
    *,
    cuda: CudaInfo | None,
    build_dir: Path,
    source_dir: Path,
    jobs: int | None = None,
    build_number: int | None = None,
    commit: str | None = None,
    extra: Sequence[str] = (),
    target: str = "llama-server",
) -> list[list[str]]:
    """[configure, build] command lines for the llama-server target (or another of the
    tree's targets: `blazar.engines.tools` builds llama-quantize)."""
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if any(re.fullmatch(r"-DGGML_NATIVE(:BOOL)?=(ON|1|TRUE|YES)", a, re.I) for a in extra):
        raise InvalidInput("GGML_NATIVE=ON is refused: native builds fault (SIGILL) on this VM")
    configure = ["cmake", "-S", str(source_dir), "-B", str(build_dir), *BASE_FLAGS]
    configure.append(f"-DLLAMA_BUILD_NUMBER={build_number or 0}")
    if commit:
        configure.append(f"-DLLAMA_BUILD_COMMIT={commit}")
    if backend == "cuda":
        configure += cuda_flags("GGML_CUDA", cuda)
    configure += extra
    jobs = jobs or os.cpu_count() or 1
    build = ["cmake", "--build", str(build_dir), "--target", target, "-j", str(jobs)]
    return [configure, build]


def build_source(
    engines_root: Path,
    spec: str,
    backend: str,
    *,
    work_dir: Path,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    runner: Runner = subprocess.run,
    cuda: CudaInfo | None = None,
    extra: Sequence[str] = (),
    lane: str = KIND,
    tag: str | None = None,
) -> InstalledEngine:
    """Build llama-server from `spec` for `backend` and install it as a new engine.

    `lane` and `tag` are a fork lane's (`blazar.engines.forks`): its own directory
    and a tag that names the pinned commit; the mainstream lane's tag comes from
    the tree's build number.
    """
    say = log or (lambda _msg: None)
    if backend not in BACKENDS:
        raise InvalidInput(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "cuda" and cuda is None:
        cuda = detect_cuda(runner=runner)
        if cuda is None:
            raise SourceBuildError("no nvcc found: install the CUDA toolkit, or build cpu")
    tree = resolve_source(spec, work_dir, runner=runner)
    tag = tag or engine_tag(tree, backend)
    if (lane_dir(engines_root, lane) / tag).exists():  # fail before a ten-minute build
        raise AlreadyExists(f"engine {lane} {tag} is already installed: `blazar engine rm {tag}`")
    build_dir = work_dir / f"build-{backend}"
    cache = build_dir / "CMakeCache.txt"
    if cache.exists() and f"CMAKE_HOME_DIRECTORY:INTERNAL={tree.root}\n" not in cache.read_text():
        shutil.rmtree(build_dir)  # configured for another tree: cmake would refuse it
    commands = cmake_args(
        backend,
        cuda=cuda,
        build_dir=build_dir,
        source_dir=tree.root,
        jobs=jobs,
        build_number=tree.build_number,
        commit=tree.commit,
        extra=extra,
    )
    log_path = work_dir / f"build-{backend}.log"
    run_cmake(commands, log_path, str(tree.root), say, runner)
    built = build_dir / "bin"
    if not (built / "llama-server").is_file():
        raise SourceBuildError(f"the build finished but made no {built / 'llama-server'}")
    with staging(engines_root, tag, lane) as (tmp, final):
        (tmp / "bin").mkdir()
        for item in [built / "llama-server", *sorted(built.glob("*.so*"))]:
            shutil.copy2(item, tmp / "bin" / item.name)
        shutil.copy2(log_path, tmp / "build.log")
        cmd = [str(tmp / "bin" / "llama-server"), "--version"]
        check = _run(runner, cmd, capture_output=True, text=True, timeout=60)
        said = f"{check.stdout or ''}{check.stderr or ''}"
        if check.returncode != 0:
            raise SourceBuildError(f"the built llama-server does not start:\n{_tail(said, 8)}")
        publish(tmp, final)
    say(f"installed {lane} {tag} at {final}")
    details = {"source": spec, "backend": backend, "cmake_args": " ".join(commands[0])}
    details["version_output"] = next((ln for ln in said.splitlines() if "version" in ln), "")
    if backend == "cuda" and cuda is not None:
        details["cuda"] = f"{cuda.version[0]}.{cuda.version[1]}"
    return InstalledEngine(
        kind=lane,
        tag=tag,
        method="source",
        version=tree.commit or f"b{tree.build_number or 0}",
        path=final,
        command=[str(final / "bin" / "llama-server")],
        details=details,
    )
