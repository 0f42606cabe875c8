# Blazar's entry points: `make run`, `make test` and `make test-ui`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-ui ui-screenshots chromium lint engine-wheels quantize-tool sd-server check-python clean

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Blazar needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'

$(BIN)/python: | check-python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[quickstart]'
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[quickstart,test]'
	@touch $@

# The engine wheels the tests install (tests/test_engines.py, test_serve.py, ...), fetched
# here so that the suite itself runs offline (tests/offline.py); tests/fixtures.py pins the
# same versions (ENGINE_VERSIONS: tests/test_fixtures.py checks they agree) and reads the
# same cache. A version already cached is not fetched again.
TEST_ENGINE_VERSIONS := 2026.10.11549 2026.9.11063
WHEEL_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/blazar-tests/wheels

# The audio lanes' engines (tests/test_audio_*.py) are installed with their dependencies
# from the same cache (--no-index), so each is downloaded with them: about 200 MB in all
# (CTranslate2, ONNX Runtime, PyAV, numpy, ...). faster-whisper 1.2.0 is the version whose
# launcher does not start (it imports requests without declaring it): the update test's
# refused candidate. mistralrs (tests/test_mistralrs*.py) is one 26 MB wheel with no
# dependencies, installed the same way.
AUDIO_ENGINES := faster_whisper:1.2.1 faster_whisper:1.2.0 piper_tts:1.8.0 piper_tts:1.7.0 \
	mistralrs:0.9.5

engine-wheels: $(VENV)/.installed-test
	@for v in $(TEST_ENGINE_VERSIONS); do \
		ls "$(WHEEL_CACHE)"/xllamacpp-$$v-*.whl >/dev/null 2>&1 || \
		$(BIN)/python -m pip download --quiet --no-deps --only-binary :all: \
			-d "$(WHEEL_CACHE)" "xllamacpp==$$v" || exit 1; \
	done
	@for e in $(AUDIO_ENGINES); do \
		name=$${e%%:*}; v=$${e##*:}; \
		ls "$(WHEEL_CACHE)"/$$name-$$v-*.whl >/dev/null 2>&1 || \
		$(BIN)/python -m pip download --quiet --only-binary :all: \
			-d "$(WHEEL_CACHE)" "$$(echo $$name | tr _ -)==$$v" || exit 1; \
	done

# llama-quantize for tests/test_quantize.py, built once into the same cache by the code that
# `blazar quantize --build` runs, from the llama.cpp tree (commit 0c1e570) that the
# llama-cpp-python sdist vendors: about 12 minutes of cmake on two cores the first time.
TEST_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/blazar-tests
QUANTIZE_SDIST := llama_cpp_python-0.3.36.tar.gz

quantize-tool: $(VENV)/.installed-test
	@ls "$(TEST_CACHE)"/engines/tools/llama-quantize/*/llama-quantize >/dev/null 2>&1 || { \
		mkdir -p "$(TEST_CACHE)/src" && \
		{ test -f "$(TEST_CACHE)/src/$(QUANTIZE_SDIST)" || \
		  $(BIN)/python -m pip download --quiet --no-deps --no-binary :all: \
			-d "$(TEST_CACHE)/src" llama-cpp-python==0.3.36; } && \
		work=$$(mktemp -d) && \
		$(BIN)/python -c 'import sys; from pathlib import Path; from blazar.engines.tools import build_quantize; build_quantize(Path(sys.argv[1]), sys.argv[2], work_dir=Path(sys.argv[3]), log=print)' \
			"$(TEST_CACHE)/engines" "$(TEST_CACHE)/src/$(QUANTIZE_SDIST)" "$$work" && \
		rm -rf "$$work"; }

# sd-server (stable-diffusion.cpp's server: the sdcpp lane) for tests/test_sdcpp*.py and
# tests/test_images*.py, built once into the same cache by the code that `blazar engine
# install --kind sdcpp` runs (blazar.engines.sdcpp), from the stable-diffusion.cpp tree the
# stable-diffusion-cpp-python sdist vendors: about 5 minutes of cmake on two cores.
SD_VERSION := 0.4.7
SD_SDIST := stable_diffusion_cpp_python-$(SD_VERSION).tar.gz

sd-server: $(VENV)/.installed-test
	@ls "$(TEST_CACHE)"/engines/sdcpp/sdcpp-$(SD_VERSION)-cpu/sd-server >/dev/null 2>&1 || { \
		mkdir -p "$(TEST_CACHE)/src" && \
		{ test -f "$(TEST_CACHE)/src/$(SD_SDIST)" || \
		  $(BIN)/python -m pip download --quiet --no-deps --no-binary :all: \
			-d "$(TEST_CACHE)/src" stable-diffusion-cpp-python==$(SD_VERSION); } && \
		work=$$(mktemp -d) && \
		$(BIN)/python -c 'import sys; from pathlib import Path; from blazar.engines.sdcpp import build_sd_server; build_sd_server(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], work_dir=Path(sys.argv[4]), jobs=2, log=print)' \
			"$(TEST_CACHE)/engines" "$(TEST_CACHE)/src/$(SD_SDIST)" "$(SD_VERSION)" "$$work" && \
		rm -rf "$$work"; }

## run: set up Blazar and run it on its default model (Gemma 3 270M).
run: $(VENV)/.installed-run
	$(BIN)/python -m blazar.cli.quickstart

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## test: set up the test environment and run lint, types, layering and the whole suite,
## then blazar-sdk's own (sdk/python/Makefile: its tests start serve from this .venv).
## Each run prints its 25 slowest tests (--durations=25): the suite's time shows in CI.
test: lint engine-wheels quantize-tool sd-server
	$(BIN)/python -m pytest --durations=25
	$(MAKE) -C sdk/python test PYTHON=$(abspath $(BIN)/python)

# The dashboard's browser tests (tests/test_ui_browser.py, the `ui` mark) drive Debian's
# headless Chromium through Playwright (Playwright's own browser download is not used).
CHROMIUM ?= /usr/bin/chromium-headless-shell

chromium:
	@command -v $(CHROMIUM) >/dev/null 2>&1 || { \
		echo "installing chromium-headless-shell with apt-get (the browser tests need it)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q chromium-headless-shell; }

## test-ui: install the headless browser when missing, then run the dashboard's browser tests.
test-ui: chromium engine-wheels
	BLAZAR_UI=1 BLAZAR_CHROMIUM=$(CHROMIUM) $(BIN)/python -m pytest -m ui --durations=25

## ui-screenshots: the browser tests, keeping their screenshots in docs/ui/ (docs/ui.md).
ui-screenshots:
	BLAZAR_UI_SHOTS=$(CURDIR)/docs/ui $(MAKE) test-ui

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
