"""The `source` install method: cmake arguments, CUDA detection, source trees, the build flow.

The default tests use fakes for cmake and the CUDA tools and real git on
local repositories. The end-to-end build of llama.cpp (about 10 minutes, from
an sdist pip downloads) is opt-in: BLAZAR_SLOW=1 BLAZAR_NETWORK=1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from blazar.engines import source
from blazar.engines.source import (
    CudaInfo,
    SourceBuildError,
    SourceTree,
    build_source,
    cmake_args,
    detect_cuda,
    engine_tag,
    resolve_source,
)
from blazar.errors import AlreadyExists, InvalidInput

CUDA = CudaInfo(
    nvcc="/usr/local/cuda/bin/nvcc",
    version=(12, 4),
    archs=("86", "89"),
    host_compiler="/usr/bin/g++-13",
)
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=m"]


def make_tree(path: Path, server: str = "tools/server") -> Path:
    """A directory that looks like a llama.cpp checkout (nothing in it builds)."""
    (path / server).mkdir(parents=True)
    (path / server / "main.cpp").write_text("int main() {}\n")  # git keeps no empty dirs
    (path / "include").mkdir()
    (path / "include" / "llama.h").write_text("// llama\n")
    (path / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    return path


def git(repo: Path, *args: str) -> str:
    done = subprocess.run([*GIT, "-C", str(repo), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def make_repo(path: Path, commits: int = 2) -> Path:
    make_tree(path)
    git(path, "init", "-q")
    for i in range(commits):
        (path / "README.md").write_text(f"commit {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"c{i}")
        git(path, "tag", f"b{i + 1}")
    return path


# cmake_args ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "cuda", "present", "absent"),
    [
        (
            "cpu",
            None,
            [
                "-DGGML_NATIVE=OFF",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DBUILD_SHARED_LIBS=OFF",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_NUMBER=0",
            ],
            ["-DGGML_CUDA=ON"],
        ),
        ("cpu", CUDA, ["-DGGML_NATIVE=OFF"], ["-DGGML_CUDA=ON"]),
        (
            "cuda",
            CUDA,
            [
                "-DGGML_CUDA=ON",
                "-DCMAKE_CUDA_ARCHITECTURES=86;89",
                "-DCMAKE_CUDA_HOST_COMPILER=/usr/bin/g++-13",
                "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc",
                "-DGGML_NATIVE=OFF",
            ],
            [],
        ),
        (
            "cuda",
            CudaInfo("nvcc", (13, 0), (), "g++"),
            ["-DGGML_CUDA=ON"],
            ["-DCMAKE_CUDA_ARCHITECTURES="],
        ),
    ],
)
def test_cmake_args(
    backend: str, cuda: CudaInfo | None, present: list[str], absent: list[str]
) -> None:
    configure, build = cmake_args(
        backend, cuda=cuda, build_dir=Path("/b"), source_dir=Path("/s"), jobs=3
    )
    assert configure[:5] == ["cmake", "-S", "/s", "-B", "/b"]
    assert "-DCMAKE_BUILD_TYPE=Release" in configure
    for flag in present:
        assert flag in configure
    for flag in absent:
        assert not any(arg.startswith(flag) for arg in configure)
    assert "-DGGML_NATIVE=ON" not in configure
    assert not any(re.match(r"-DLLAMA_(CURL|USE_PREBUILT_UI|OPENSSL)=ON", a) for a in configure)
    assert build == ["cmake", "--build", "/b", "--target", "llama-server", "-j", "3"]


def test_cmake_args_build_info_and_extra() -> None:
    configure, _ = cmake_args(
        "cpu",
        cuda=None,
        build_dir=Path("/b"),
        source_dir=Path("/s"),
        build_number=11549,
        commit="0c1e570",
        extra=["-DGGML_AVX512=OFF"],
    )
    assert "-DLLAMA_BUILD_NUMBER=11549" in configure
    assert "-DLLAMA_BUILD_COMMIT=0c1e570" in configure
    assert configure[-1] == "-DGGML_AVX512=OFF"


@pytest.mark.parametrize(
    ("backend", "cuda", "extra", "message"),
    [
        ("rocm", None, [], "unknown backend"),
        ("cuda", None, [], "needs nvcc"),
        ("cpu", None, ["-DGGML_NATIVE=ON"], "SIGILL"),
    ],
)
def test_cmake_args_refuses(
    backend: str, cuda: CudaInfo | None, extra: list[str], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        cmake_args(backend, cuda=cuda, build_dir=Path("b"), source_dir=Path("s"), extra=extra)


@pytest.mark.parametrize(
    ("build", "commit", "tag"),
    [
        (11549, "0c1e570", "b11549-cpu"),
        (None, "0c1e570", "b0-cpu-0c1e570"),
        (None, None, "b0-cpu-local"),
    ],
)
def test_engine_tag(build: int | None, commit: str | None, tag: str) -> None:
    assert engine_tag(SourceTree(Path("/s"), "s", commit, build), "cpu") == tag


# detect_cuda --------------------------------------------------------------------------------


class FakeTools:
    """which() and a runner that answer like a machine with the given tools."""

    def __init__(
        self,
        nvcc: str | None = "12.4",
        gxx: tuple[int, ...] = (12, 13, 14),
        smi: str | None = None,
        plain_gxx: str | None = None,
        nvcc_path: str = "/opt/cuda/bin/nvcc",
    ) -> None:
        self.nvcc, self.gxx, self.smi, self.plain_gxx = nvcc, gxx, smi, plain_gxx
        self.nvcc_path = nvcc_path

    def which(self, name: str) -> str | None:
        if name == "nvcc":
            return self.nvcc_path if self.nvcc else None
        if name == "nvidia-smi":
            return "/usr/bin/nvidia-smi" if self.smi is not None else None
        if name == "g++":
            return "/usr/bin/g++" if self.plain_gxx else None
        match = re.fullmatch(r"g\+\+-(\d+)", name)
        return f"/usr/bin/{name}" if match and int(match.group(1)) in self.gxx else None

    def run(self, cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        out = {
            self.nvcc_path: f"Cuda compilation tools, release {self.nvcc}, V{self.nvcc}.1\n",
            "/usr/bin/nvidia-smi": self.smi or "",
            "/usr/bin/g++": f"{self.plain_gxx}\n",
        }[cmd[0]]
        return subprocess.CompletedProcess(cmd, 0, out, "")


def detect(
    tools: FakeTools, caps: list[tuple[int, int]] | None = None, home: str = "/nonexistent"
) -> CudaInfo | None:
    return detect_cuda(
        runner=tools.run, which=tools.which, compute_caps=lambda: caps or [], cuda_home=home
    )


def test_detect_cuda_without_nvcc_is_none() -> None:
    assert detect(FakeTools(nvcc=None)) is None


def test_detect_cuda_picks_newest_accepted_gcc_and_archs_from_nvml() -> None:
    info = detect(FakeTools(nvcc="12.4", gxx=(12, 13, 14)), caps=[(8, 9), (8, 6), (8, 6)])
    assert info == CudaInfo("/opt/cuda/bin/nvcc", (12, 4), ("86", "89"), "/usr/bin/g++-13")


def test_detect_cuda_falls_back_to_nvidia_smi() -> None:
    info = detect(FakeTools(smi="8.6\n8.9\n"), caps=[])
    assert info is not None and info.archs == ("86", "89")


def test_detect_cuda_without_gpus_leaves_archs_to_ggml() -> None:
    info = detect(FakeTools(), caps=[])
    assert info is not None and info.archs == ()


def test_detect_cuda_uses_plain_gxx_by_its_version() -> None:
    info = detect(FakeTools(nvcc="12.2", gxx=(), plain_gxx="12.3.0"))
    assert info is not None and info.host_compiler == "/usr/bin/g++"


def test_detect_cuda_without_acceptable_compiler() -> None:
    with pytest.raises(SourceBuildError, match=r"needs g\+\+ 12 or older.*g\+\+ 13, g\+\+ 14"):
        detect(FakeTools(nvcc="12.1", gxx=(13, 14)))


@pytest.mark.parametrize("layout", ["include", "targets/x86_64-linux/include"])
def test_detect_cuda_trusts_nvccs_own_header(tmp_path: Path, layout: str) -> None:
    crt = tmp_path / "cuda" / layout / "crt"
    crt.mkdir(parents=True)
    (crt / "host_config.h").write_text("#if __GNUC__ > 12\n#error -- unsupported GNU version!\n")
    tools = FakeTools(nvcc="13.0", gxx=(12, 14), nvcc_path=str(tmp_path / "cuda/bin/nvcc"))
    info = detect(tools)  # the table says 15 for CUDA 13.0; the header wins
    assert info is not None and info.host_compiler == "/usr/bin/g++-12"
    wrapper = FakeTools(nvcc="13.0", gxx=(12, 14), nvcc_path="/usr/local/bin/nvcc")
    info = detect(wrapper, home=str(tmp_path / "cuda"))  # a wrapper script: found via CUDA_HOME
    assert info is not None and info.host_compiler == "/usr/bin/g++-12"


@pytest.mark.parametrize(
    ("cuda", "cap"),
    [
        ((10, 2), None),
        ((11, 8), 11),
        ((12, 0), 12),
        ((12, 3), 12),
        ((12, 4), 13),
        ((12, 6), 13),
        ((12, 8), 14),
        ((12, 9), 14),
        ((13, 0), 15),
        ((13, 3), 15),
    ],
)
def test_gcc_cap(cuda: tuple[int, int], cap: int | None) -> None:
    assert source.gcc_cap(cuda) == cap


def test_nvml_compute_caps_without_gpu_is_empty_or_real() -> None:
    caps = source.nvml_compute_caps()  # no GPU here: []; on a GPU machine, real pairs
    assert all(isinstance(major, int) and isinstance(minor, int) for major, minor in caps)


# resolve_source -----------------------------------------------------------------------------


def test_resolve_local_tree_without_git(tmp_path: Path) -> None:
    tree = resolve_source(str(make_tree(tmp_path / "llama.cpp")), tmp_path / "work")
    assert tree.root == (tmp_path / "llama.cpp").resolve()
    assert (tree.commit, tree.build_number) == (None, None)


def test_resolve_tree_named_by_release(tmp_path: Path) -> None:
    tree = resolve_source(str(make_tree(tmp_path / "llama.cpp-b4321", "examples/server")), tmp_path)
    assert tree.build_number == 4321


def test_resolve_missing_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        resolve_source(str(tmp_path / "nope"), tmp_path / "work")


def test_resolve_dir_without_cmakelists(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "llama.cpp")
    (tree / "CMakeLists.txt").unlink()
    with pytest.raises(InvalidInput, match=r"no llama\.cpp source tree.*CMakeLists\.txt"):
        resolve_source(str(tree), tmp_path / "work")


def test_resolve_tarball_finds_vendored_tree(tmp_path: Path) -> None:
    pkg = tmp_path / "llama_cpp_python-0.3.36"
    (pkg / "examples" / "server").mkdir(parents=True)  # the wrapper has examples/server ...
    (pkg / "CMakeLists.txt").write_text("project(llama_cpp_python)\n")
    make_tree(pkg / "vendor" / "llama.cpp")  # ... but only the vendored tree has llama.h
    sdist = tmp_path / "pkg.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(pkg, arcname=pkg.name)
    tree = resolve_source(str(sdist), tmp_path / "work")
    assert tree.root.parts[-3:] == ("llama_cpp_python-0.3.36", "vendor", "llama.cpp")
    assert tree.root.is_relative_to(tmp_path / "work")


def test_resolve_file_that_is_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InvalidInput, match="not a directory or a tar archive"):
        resolve_source(str(tmp_path / "x.txt"), tmp_path / "work")


def test_resolve_git_url_counts_commits_and_checks_out_refs(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", commits=3)
    head = git(repo, "rev-parse", "--short=7", "HEAD")
    tree = resolve_source(f"file://{repo}", tmp_path / "work")
    assert (tree.commit, tree.build_number) == (head, 3)
    assert (tree.root / "README.md").read_text() == "commit 2\n"
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    tree = resolve_source(f"file://{repo}@{first}", tmp_path / "work")
    assert (tree.commit, tree.build_number) == (first[:7], 1)
    assert (tree.root / "README.md").read_text() == "commit 0\n"


@pytest.mark.parametrize(
    ("spec", "url", "ref"),
    [
        ("https://github.com/ggml-org/llama.cpp", "https://github.com/ggml-org/llama.cpp", None),
        (
            "https://github.com/ggml-org/llama.cpp@b11549",
            "https://github.com/ggml-org/llama.cpp",
            "b11549",
        ),
        ("git@github.com:ggml-org/llama.cpp.git", "git@github.com:ggml-org/llama.cpp.git", None),
        ("git@github.com:o/r.git@0c1e570", "git@github.com:o/r.git", "0c1e570"),
        ("https://user@host/r.git", "https://user@host/r.git", None),
        ("file:///tmp/repo@v1.2", "file:///tmp/repo", "v1.2"),
    ],
)
def test_split_ref(spec: str, url: str, ref: str | None) -> None:
    assert source.split_ref(spec) == (url, ref)


def test_missing_cmake_is_a_clear_error(tmp_path: Path) -> None:
    def no_cmake(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        if cmd[0] == "cmake":
            raise FileNotFoundError(2, "No such file or directory", "cmake")
        return subprocess.run(cmd, **kwargs)

    with pytest.raises(SourceBuildError, match="cmake is not installed"):
        build_source(
            tmp_path / "e",
            str(make_tree(tmp_path / "t")),
            "cpu",
            work_dir=tmp_path,
            runner=no_cmake,
        )


def test_resolve_git_url_without_the_ref(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    with pytest.raises(InvalidInput, match="has no ref 'deadbeef'"):
        resolve_source(f"file://{repo}@deadbeef", tmp_path / "work")


def test_resolve_bad_git_url(tmp_path: Path) -> None:
    with pytest.raises(SourceBuildError, match=r"git clone .* failed"):
        resolve_source(f"file://{tmp_path}/no-such-repo.git", tmp_path / "work")


def test_shallow_clone_has_no_build_number(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", commits=3)
    git(repo, "tag", "-d", "b3")  # no exact b<N> tag either
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True
    )
    tree = resolve_source(str(shallow), tmp_path / "work")
    assert tree.build_number is None and tree.commit == git(repo, "rev-parse", "--short=7", "HEAD")
    assert engine_tag(tree, "cpu") == f"b0-cpu-{tree.commit}"


# build_source with a fake cmake -------------------------------------------------------------

FAKE_SERVER = '#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1234 (abcdef0)" >&2; fi\n'


class FakeCMake:
    """Answers cmake commands; every other command (the built server) really runs."""

    def __init__(self, fail: str | None = None, server: str = FAKE_SERVER) -> None:
        self.fail, self.server = fail, server
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        if cmd[0] != "cmake":
            return subprocess.run(cmd, **kwargs)
        self.calls.append(cmd)
        step = "build" if cmd[1] == "--build" else "configure"
        for i in range(30):
            kwargs["stdout"].write(f"{step} line {i}\n")
        if step == self.fail:
            kwargs["stdout"].write("error: the compiler gave up\n")
            return subprocess.CompletedProcess(cmd, 2)
        if step == "build":
            server = Path(cmd[2]) / "bin" / "llama-server"
            server.parent.mkdir(parents=True, exist_ok=True)
            server.write_text(self.server)
            server.chmod(0o755)
        return subprocess.CompletedProcess(cmd, 0)


def test_build_source_installs_the_server(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "llama.cpp", commits=2)
    git(repo, "tag", "-d", "b2")
    runner, messages = FakeCMake(), list[str]()
    engine = build_source(
        tmp_path / "engines",
        str(repo),
        "cpu",
        work_dir=tmp_path / "work",
        jobs=2,
        runner=runner,
        log=messages.append,
    )
    assert engine.tag == "b2-cpu" and engine.method == "source" and engine.kind == "llamacpp"
    assert engine.path == tmp_path / "engines" / "llamacpp" / "b2-cpu"
    assert engine.version == git(repo, "rev-parse", "--short=7", "HEAD")
    assert engine.command == [str(engine.path / "bin" / "llama-server")]
    assert os.access(engine.command[0], os.X_OK)
    assert engine.details["source"] == str(repo) and engine.details["backend"] == "cpu"
    assert "-DGGML_NATIVE=OFF" in engine.details["cmake_args"]
    assert "-DLLAMA_BUILD_NUMBER=2" in engine.details["cmake_args"]
    assert engine.details["version_output"] == "version: 1234 (abcdef0)"
    assert [c[:2] for c in runner.calls] == [["cmake", "-S"], ["cmake", "--build"]]
    assert runner.calls[1][-2:] == ["-j", "2"]
    assert sorted(p.name for p in engine.path.parent.iterdir()) == ["b2-cpu"]  # no .tmp-* left
    assert any("build" in m and "build-cpu.log" in m for m in messages)
    with pytest.raises(AlreadyExists):  # before any cmake run
        build_source(
            tmp_path / "engines", str(repo), "cpu", work_dir=tmp_path / "work", runner=runner
        )
    assert len(runner.calls) == 2


def test_build_source_cuda_with_given_toolchain(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "llama.cpp")
    runner = FakeCMake()
    engine = build_source(
        tmp_path / "engines", str(tree), "cuda", work_dir=tmp_path / "w", runner=runner, cuda=CUDA
    )
    assert engine.tag == "b0-cuda-local" and engine.details["cuda"] == "12.4"
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in runner.calls[0]


@pytest.mark.parametrize("step", ["configure", "build"])
def test_failed_build_leaves_no_engine_and_reports_the_log_tail(tmp_path: Path, step: str) -> None:
    tree = make_tree(tmp_path / "llama.cpp")
    with pytest.raises(SourceBuildError) as caught:
        build_source(
            tmp_path / "engines",
            str(tree),
            "cpu",
            work_dir=tmp_path / "work",
            runner=FakeCMake(fail=step),
        )
    message = str(caught.value)
    assert f"cmake {step}" in message and "exit code 2" in message
    assert str(tmp_path / "work" / "build-cpu.log") in message
    assert "error: the compiler gave up" in message and f"{step} line 29" in message
    assert f"{step} line 5\n" not in message  # only the tail
    lane = tmp_path / "engines" / "llamacpp"
    assert not lane.exists() or list(lane.iterdir()) == []


def test_server_that_does_not_start_is_not_installed(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "llama.cpp")
    broken = FakeCMake(server="#!/bin/sh\necho 'illegal instruction' >&2\nexit 132\n")
    with pytest.raises(SourceBuildError, match="does not start:\nillegal instruction"):
        build_source(tmp_path / "engines", str(tree), "cpu", work_dir=tmp_path / "w", runner=broken)
    assert list((tmp_path / "engines" / "llamacpp").iterdir()) == []  # staging cleaned up


def test_cuda_build_without_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "detect_cuda", lambda **_: None)
    with pytest.raises(SourceBuildError, match="no nvcc found"):
        build_source(tmp_path / "e", str(make_tree(tmp_path / "t")), "cuda", work_dir=tmp_path)


# the real thing, opt-in ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.network  # pip downloads the llama-cpp-python sdist
@pytest.mark.timeout(3600)
def test_build_llama_cpp_from_the_pypi_sdist(tmp_path: Path, tiny_model: Path) -> None:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, "llama-cpp-python==0.3.36", "-d", str(tmp_path)], check=True)
    sdist = next(tmp_path.glob("llama_cpp_python-*.tar.gz"))
    engine = build_source(
        tmp_path / "engines", str(sdist), "cpu", work_dir=tmp_path / "work", log=print
    )
    assert engine.tag == "b0-cpu-0c1e570"  # the sdist vendors a shallow clone
    argv = [*engine.command, "--model", str(tiny_model), "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        port = None
        deadline = time.monotonic() + 120
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"llama-server exited with {proc.poll()}"
            if match := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                port = int(match.group(1))
        assert port, "llama-server never said where it listens"
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        body = json.dumps({"prompt": "hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.load(resp)
        assert answer["choices"][0]["text"] is not None
        assert answer["usage"]["completion_tokens"] >= 1
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
