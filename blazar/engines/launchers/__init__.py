"""The standalone launchers: the scripts an engine's own Python runs to serve a model.

Each package lane's engine is a virtual environment of its own with the engine package
in it, not Blazar; its supervisor runs a launcher from this folder there, as it runs
`llama-server`, and reads the `listening on` line it prints:

- `llama_launcher.py`: llama-server's flags on xllamacpp (the `wheel` method of the
  llamacpp lane, `blazar.engines.wheel`; installed as `launcher.py`);
- `whisper_launcher.py`: faster-whisper, speech to text (`blazar.engines.audio`);
- `piper_launcher.py`: piper-tts, text to speech;
- `mistralrs_launcher.py`: mistral.rs over OpenAI's API;
- `launcher_common.py`: what they share (the `main` skeleton, the flags, the HTTP
  handler with `/health`), copied beside each one (`blazar.engines.wheel.place_launcher`);
- `fork_launcher.py`: not installed: serve runs it from here under a wheel engine's
  Python, beside the engine's `launcher.py`, as a fork server that has imported the
  launcher once and forks a child per model start (`blazar.serve.supervisor.forks`).

They use the standard library and their engine package only, and import
`launcher_common` as a sibling module. Every name here ends in `launcher` (or names
it) because a copy lands in the engine's folder, where this folder's name is gone and a
script called `piper.py` or `mistralrs.py` would shadow the very package it imports.
This module is Blazar's side only: where the scripts are.
"""

from __future__ import annotations

from pathlib import Path

FOLDER = Path(__file__).parent
COMMON = FOLDER / "launcher_common.py"  # copied beside every launcher
LLAMA = FOLDER / "llama_launcher.py"
FORK = FOLDER / "fork_launcher.py"  # run from here, never copied
