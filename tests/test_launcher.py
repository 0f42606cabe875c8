"""The xllamacpp launcher: llama-server's flags in, llama-server's HTTP API out.

Each server runs the launcher as a real child process (`sys.executable`, whose
environment has xllamacpp) on a free loopback port, is found through the
`blazar-launcher: listening on` line it prints, and is stopped by PID with
SIGTERM, which must end it with exit code 0 and leave no process behind.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from blazar.engines import audio, launchers, sdcpp
from blazar.engines.launchers import llama_launcher as launcher
from blazar.testing.tiny import LORA_WORD, is_tiny_text, write_tiny_lora, write_tiny_model

LAUNCHER = Path(launcher.__file__)
LISTENING = "blazar-launcher: listening on "
START_DEADLINE_S = 30.0
STOP_DEADLINE_S = 5.0
FAST = ("--ctx-size", "512", "--threads", "2", "--threads-batch", "2")


class Launched:
    """A launcher child process that reported its address."""

    def __init__(self, proc: subprocess.Popen[str], url: str, stdout: list[str], stderr: Path):
        self.proc, self.url, self.stdout, self.stderr = proc, url, stdout, stderr

    def request(
        self, path: str, *, headers: dict[str, str] | None = None, body: Any = None
    ) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers or {})
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, path: str, **kwargs: Any) -> Any:
        status, body = self.request(path, **kwargs)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def openai(self, api_key: str = "none") -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=30)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the child by PID, wait for it (kill it past the deadline), check it is gone."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)
            try:
                self.proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with pytest.raises(ProcessLookupError):
            os.kill(self.proc.pid, 0)
        return self.proc.returncode


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Launched]]:
    """Start the launcher with the given flags; every child is stopped and checked at the end."""
    started: list[Launched] = []

    def start(*args: str | Path) -> Launched:
        stderr = tmp_path / f"launcher-{len(started)}.err"
        command = [sys.executable, str(LAUNCHER), "--host", "127.0.0.1", "--port", "0"]
        with stderr.open("w") as err:
            proc = subprocess.Popen(
                [*command, *FAST, *map(str, args)], stdout=subprocess.PIPE, stderr=err, text=True
            )
        lines: queue.Queue[str | None] = queue.Queue()
        stdout: list[str] = []

        def read() -> None:  # drains stdout for the child's whole life
            assert proc.stdout is not None
            for line in proc.stdout:
                stdout.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                proc.kill()
                proc.wait()
                raise AssertionError(f"launcher did not come up:\n{stderr.read_text()}")
            if line.startswith(LISTENING):
                break
        server = Launched(proc, line.removeprefix(LISTENING).strip(), stdout, stderr)
        started.append(server)
        return server

    yield start
    for server in started:
        code = server.stop()
        assert code == 0, f"launcher exited {code} on SIGTERM:\n{server.stderr.read_text()}"


def run_launcher(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LAUNCHER), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- serving -----------------------------------------------------------------------------


def test_serves_tiny_model_with_openai_client(
    launch: Callable[..., Launched], tiny_model: Path
) -> None:
    server = launch("--model", tiny_model)
    port = server.url.rsplit(":", 1)[1]
    assert server.stdout == [
        f"main: server is listening on http://127.0.0.1:{port} - starting the main loop\n",
        f"blazar-launcher: listening on http://127.0.0.1:{port}\n",
    ]
    assert server.request("/health")[0] == 200

    client = server.openai()
    completion = client.completions.create(model="tiny", prompt="the cat", max_tokens=6)
    assert is_tiny_text(completion.choices[0].text.strip(), allow=())
    assert completion.usage.completion_tokens == 6
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    assert is_tiny_text((chat.choices[0].message.content or "").strip(), allow=())


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_it_quickly_with_exit_code_zero(
    launch: Callable[..., Launched], tiny_model: Path, signum: int
) -> None:
    server = launch("--model", tiny_model)
    started = time.monotonic()
    assert server.stop(signum) == 0
    assert time.monotonic() - started < 2.0


def test_parallel_gives_that_many_slots(launch: Callable[..., Launched], tiny_model: Path) -> None:
    server = launch("--model", tiny_model, "--parallel", "2")
    assert len(server.json("/slots")) == 2
    assert server.json("/props")["total_slots"] == 2


def test_alias_names_the_model(launch: Callable[..., Launched], tiny_model: Path) -> None:
    server = launch("-m", tiny_model, "-a", "tiny-chat")
    assert [m.id for m in server.openai().models.list()] == ["tiny-chat"]


def test_metrics_only_with_the_flag(launch: Callable[..., Launched], tiny_model: Path) -> None:
    plain = launch("--model", tiny_model)
    assert plain.request("/metrics")[0] != 200
    server = launch("--model", tiny_model, "--metrics")
    server.json("/completion", body={"prompt": "the", "n_predict": 2})
    status, body = server.request("/metrics")
    assert status == 200
    assert "llamacpp:tokens_predicted_total 2" in body.decode()


def test_other_flags_show_in_props_and_endpoints(
    launch: Callable[..., Launched], tiny_model: Path
) -> None:
    flags = "-c 256 -n 3 -s 42 --no-slots --props --no-mmap --no-warmup -kvu --cache-reuse 16"
    server = launch("--model", tiny_model, *flags.split())
    props = server.json("/props")
    assert props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["seed"] == 42
    assert props["endpoint_props"] is True
    assert props["endpoint_slots"] is False
    assert server.request("/slots")[0] == 501
    # -n is the default limit of a request that sets none
    assert server.json("/completion", body={"prompt": "the"})["tokens_predicted"] == 3


def test_api_key_guards_everything_but_health(
    launch: Callable[..., Launched], tiny_model: Path
) -> None:
    server = launch("--model", tiny_model, "--api-key", "sekrit")
    assert server.request("/health")[0] == 200
    assert server.request("/v1/models")[0] == 401
    assert server.request("/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert server.request("/v1/models", headers={"Authorization": "Bearer sekrit"})[0] == 200
    assert len(server.openai(api_key="sekrit").models.list().data) == 1


def test_lora_scaled_loads_adapter_off_until_a_request_asks(
    launch: Callable[..., Launched], tiny_model: Path, tmp_path: Path
) -> None:
    fox = write_tiny_lora(tmp_path / "fox.gguf", tiny_model)
    server = launch("--model", tiny_model, "--lora-scaled", f"{fox}:0")
    assert server.json("/lora-adapters") == [
        {"id": 0, "path": str(fox), "scale": 0.0, "task_name": "", "prompt_prefix": ""}
    ]
    base = server.json("/completion", body={"prompt": "the cat", "n_predict": 6})
    assert is_tiny_text(base["content"].strip(), allow=())
    lora = [{"id": 0, "scale": 1.0}]
    boosted = server.json("/completion", body={"prompt": "the cat", "n_predict": 6, "lora": lora})
    assert LORA_WORD in boosted["content"].split()


def test_embeddings_with_mean_pooling(launch: Callable[..., Launched], tiny_model: Path) -> None:
    server = launch("--model", tiny_model, "--embeddings", "--pooling", "mean")
    result = server.openai().embeddings.create(model="tiny", input=["the cat", "a red door"])
    vectors = [item.embedding for item in result.data]
    assert [len(v) for v in vectors] == [64, 64]
    assert vectors[0] != vectors[1]


def test_quantized_kv_cache_with_a_fitting_head_size(
    launch: Callable[..., Launched], tmp_path: Path
) -> None:
    model = write_tiny_model(tmp_path / "tiny-h2.gguf", n_head=2, n_head_kv=2)
    server = launch("--model", model, "-ctk", "q8_0", "-ctv", "q8_0", "--verbose")
    result = server.json("/completion", body={"prompt": "the cat", "n_predict": 4})
    assert is_tiny_text(result["content"].strip(), allow=())
    log = server.stderr.read_text()  # --verbose: llama.cpp logs the KV cache layout
    assert "K (q8_0)" in log and "V (q8_0)" in log


# --- flags, parsed in-process ------------------------------------------------------------


def test_flags_map_onto_common_params(tiny_model: Path, tmp_path: Path) -> None:
    import xllamacpp

    params = launcher.parse_args(
        [
            f"--model={tiny_model}",
            "-t",
            "3",
            "-tb",
            "5",
            "-ngl",
            "all",
            "-b",
            "64",
            "-ub",
            "32",
            "--seed",
            "-1",
            "--no-jinja",
            "--lora",
            "a.gguf,b.gguf",
            "--lora-scaled",
            "c.gguf:0.5",
            "--lora",
            "d.gguf",
            "--api-key",
            "k1,k2",
            "--api-key",
            "k3",
            "--alias",
            "x,y",
            "--lora-init-without-apply",
            "--embedding",
            "--pooling",
            "last",
            "--no-kv-unified",
            "-lm",
            "mmap+mlock",
            "--reuse-port",
            "--slot-save-path",
            str(tmp_path),
            "--chat-template",
            "chatml",
            "--verbose",
        ]
    )
    assert params.model.path == str(tiny_model)
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (3, 5)
    assert (params.n_gpu_layers, params.n_batch, params.n_ubatch) == (-2, 64, 32)
    assert params.sampling.seed == 2**32 - 1  # -1: random, as llama-server stores it
    assert params.use_jinja is False
    adapters = [(a.path, a.scale) for a in params.lora_adapters]
    assert adapters == [("a.gguf", 1.0), ("b.gguf", 1.0), ("c.gguf", 0.5), ("d.gguf", 1.0)]
    assert params.api_keys == ["k1", "k2", "k3"]
    assert params.model_alias == {"x", "y"}
    assert params.lora_init_without_apply and params.embedding and params.reuse_port
    assert params.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_LAST
    assert params.kv_unified is False
    assert params.load_mode == xllamacpp.llama_load_mode.LLAMA_LOAD_MODE_MMAP_MLOCK
    assert params.slot_save_path == str(tmp_path) + os.sep
    assert params.chat_template == "chatml"
    assert params.verbosity > 3
    assert (params.hostnames, params.port) == (["127.0.0.1"], 8080)

    params = launcher.parse_args(["-m", "m.gguf", "-sm", "none", "-mg", "1"])
    assert params.split_mode == xllamacpp.llama_split_mode.LLAMA_SPLIT_MODE_NONE
    assert params.main_gpu == 1
    params = launcher.parse_args(["-m", "m.gguf", "--tensor-split", "0,3,1"])
    assert params.tensor_split[:4] == [0.0, 3.0, 1.0, 0.0]

    params = launcher.parse_args(["-m", "m.gguf", "--no-mmap", "-ctk", "q4_0", "-ctv", "bf16"])
    assert params.load_mode == xllamacpp.llama_load_mode.LLAMA_LOAD_MODE_NONE
    assert params.cache_type_k == xllamacpp.ggml_type.GGML_TYPE_Q4_0
    assert params.cache_type_v == xllamacpp.ggml_type.GGML_TYPE_BF16


def test_version() -> None:
    result = run_launcher("--version")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    import xllamacpp

    build = xllamacpp.__version__.split(".")[2]  # 2026.10.11549 -> llama.cpp build 11549
    assert lines[0].startswith(f"version: {build} (") and lines[0].endswith(")")
    assert f"built with xllamacpp {xllamacpp.__version__}" in lines


def test_help_lists_the_flags() -> None:
    result = run_launcher("--help")
    assert result.returncode == 0
    for name in ("--ctx-size, -c N", "--lora-scaled FNAME:SCALE", "-ngl", "-ctk", "--no-mmap"):
        assert name in result.stdout


# --- bad input: one clear line on stderr, a non-zero exit, no traceback -------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["-m", "{model}", "--foo"], 2, "unknown flag '--foo'; llama-server flags this launcher"),
        (["-m", "{model}", "--ctx-sise", "5"], 2, "did you mean '--ctx-size'?"),
        (["--model"], 2, "flag --model needs a value (FNAME)"),
        (["--model", "--metrics"], 2, "flag --model needs a value"),
        (["-m", "{model}", "--ctx-size", "abc"], 2, "bad value for --ctx-size: expected an int"),
        (["-m", "{model}", "-ctk", "q9"], 2, "bad value for -ctk: expected one of f32, f16"),
        (["-m", "{model}", "--pooling", "max"], 2, "bad value for --pooling"),
        (["-m", "{model}", "--port", "70000"], 2, "bad value for --port: expected a port"),
        (["-m", "{model}", "-np", "9" * 30], 2, "bad value for -np: out of range"),
        (["-m", "{model}", "--lora-scaled", "fox.gguf"], 2, "expected FNAME:SCALE"),
        (["-m", "{model}", "--lora-scaled", "fox.gguf:big"], 2, "expected a number, got 'big'"),
        (["-m", "{model}", "--metrics=yes"], 2, "flag --metrics takes no value"),
        (["{model}"], 2, "unexpected argument"),
        (["--port", "0"], 2, "no model given"),
        (["-m", "{tmp}/missing.gguf"], 1, "model not found: {tmp}/missing.gguf"),
        (["-m", "{tmp}"], 1, "model is not a file"),
        (["-m", "{model}", "--lora", "{tmp}/nofox.gguf"], 1, "LoRA adapter not found"),
        (["-m", "{tmp}/junk.gguf"], 1, "failed to load model {tmp}/junk.gguf: "),
        (["-m", "{model}", "-ctk", "q8_0"], 1, "failed to load model {model}: "),
        (["-m", "{model}", "--device", "CUDA0"], 2, "the wheel engine (xllamacpp) has no device"),
        (["-m", "{model}", "-ts", "1,-2"], 2, "--tensor-split: expected at most 128 shares"),
    ],
)
def test_bad_input_gives_one_clear_line(
    tiny_model: Path, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"this is not a GGUF file\n" * 10)

    def fill(text: str) -> str:
        return text.format(model=tiny_model, tmp=tmp_path)

    result = run_launcher("--host", "127.0.0.1", "--port", "0", *map(fill, args))
    assert result.returncode == code, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("launcher: ")
    assert fill(message) in lines[0]


def test_load_failure_quotes_llama_cpp_reason(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "junk.gguf").write_bytes(b"this is not a GGUF file\n")
    result = run_launcher("-m", tmp_path / "junk.gguf", "--port", "0")
    assert "expected 'GGUF'" in result.stderr
    result = run_launcher("-m", tiny_model, "--port", "0", "-ctk", "q8_0")
    assert "does not divide n_embd_head_k=16" in result.stderr


# What each launcher may import besides the standard library: it runs in its engine's own
# virtual environment, without Blazar, with launcher_common.py copied beside it.
ENGINE_PACKAGES = {
    "llama_launcher.py": {"xllamacpp", "launcher_common"},
    "whisper_launcher.py": {"faster_whisper", "ctranslate2", "launcher_common"},
    "piper_launcher.py": {"piper", "onnxruntime", "launcher_common"},
    "mistralrs_launcher.py": {"mistralrs", "launcher_common"},
    "sd_launcher.py": {"launcher_common"},  # sd-server is a binary it starts
    "launcher_common.py": set(),
    "fork_launcher.py": set(),  # serve's fork server: runs any launcher, imports none
}


@pytest.mark.parametrize("name", sorted(ENGINE_PACKAGES))
def test_each_launcher_needs_only_the_standard_library_and_its_engine(name: str) -> None:
    # Blazar's package path appears only in the branch taken when Blazar's own tree imports
    # it (its tests); run as a script, the sibling `launcher_common` is imported instead.
    script = launchers.FOLDER / name
    tree = ast.parse(script.read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    from_blazar = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("blazar")
    ]
    # Only the shared file, by the same name the script imports beside it.
    standalone = name in ("launcher_common.py", "fork_launcher.py")
    assert [(n.module, [a.name for a in n.names]) for n in from_blazar] == (
        [("blazar.engines.launchers", ["launcher_common"])] if not standalone else []
    )
    imported |= {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node not in from_blazar
    }
    roots = {name.split(".")[0] for name in imported}
    assert roots - sys.stdlib_module_names == ENGINE_PACKAGES[name]
    # A copy lands in the engine's folder, which is first on its sys.path: a launcher named
    # after a package it imports (piper.py) would import itself instead.
    assert script.stem not in roots


def test_the_launchers_folder_holds_the_launchers_the_lanes_install() -> None:
    scripts = {p.name for p in launchers.FOLDER.glob("*.py")} - {"__init__.py"}
    assert scripts == set(ENGINE_PACKAGES)
    installed = {lane.launcher for lane in audio.LANES.values()} | {sdcpp.LAUNCHER}
    assert installed | {launchers.LLAMA.name} == scripts - {
        launchers.COMMON.name,
        launchers.FORK.name,
    }
