# kvlattice quick start: `make run` and `make test` (both install missing Debian packages first).
# `make test` is what a user needs to trust a build: the release build and every test through ctest.
# CI (`.ci/run`, or `make ci`) adds the sanitized build's tests (`make sanitize`) and the fuzzers
# (`make fuzz`) after it.
BUILD ?= build
JOBS ?= $(shell nproc)
KVL_MODEL ?= ../shared/models/stories260K.gguf
FUZZ_SECONDS ?= 40

# ccache, where installed, keeps rebuilds of unchanged sources cheap; CCACHE_BASEDIR makes its keys
# relative to this checkout, so another clone of the same sources hits the same cache.
LAUNCHER := $(if $(shell command -v ccache 2>/dev/null),-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all deps build run test ci fuzz sanitize bench plots clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(LAUNCHER)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/kvl run -m $(KVL_MODEL) -p "Once upon a time" -n 128 --temp 0

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Everything CI runs, in its order: the user's `make test`, then the sanitized tests, then the
# fuzzers. Each stage fails the run on its own; a failing `make test` stops it before the others.
ci:
	$(MAKE) --no-print-directory test
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory sanitize

# AddressSanitizer + UndefinedBehaviorSanitizer over the layers that handle user input and memory
# the most: the KV manager, pager and tiers, the GGUF reader, the engine, the CLI and the server
# (which run the sanitized kvl binary). Any report fails the run.
SANITIZED_TESTS = test_kv test_gguf test_engine test_cli test_server
sanitize: deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVL_SANITIZE=ON $(LAUNCHER)
	cmake --build $(BUILD)-asan -j $(JOBS) --target $(SANITIZED_TESTS) kvl
	@bash scripts/run-sanitized-tests.sh $(BUILD)-asan $(SANITIZED_TESTS)

# libFuzzer needs clang; skipped with a note where clang++-14 is missing.
fuzz: deps
	@bash scripts/run-fuzz.sh $(FUZZ_SECONDS)

# Every figure of docs/BENCHMARKS.md, redrawn from the benchmark JSON kept in docs/data/ (the
# first python3 that has matplotlib: PATH's may be another than Debian's, which the deps install).
PYTHON ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import matplotlib' 2>/dev/null && echo $$p && break; done)
plots: deps
	@test -n "$(PYTHON)" || { echo "make plots: no python3 with matplotlib (python3-matplotlib)"; exit 1; }
	$(PYTHON) scripts/plots.py all docs/data docs/images

clean:
	rm -rf $(BUILD) $(BUILD)-asan build-fuzz
