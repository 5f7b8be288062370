# kvlattice quick start: `make run` and `make test` (both install missing Debian packages first).
BUILD ?= build
JOBS ?= $(shell nproc)
KVL_MODEL ?= ../shared/models/stories260K.gguf
FUZZ_SECONDS ?= 40

.PHONY: all deps build run test fuzz bench clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/kvl run -m $(KVL_MODEL) -p "Once upon a time" -n 128 --temp 0

# Fuzzing first, so that ctest's summary is the last thing printed.
test: build
	$(MAKE) --no-print-directory fuzz
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# libFuzzer needs clang; skipped with a note where clang++-14 is missing.
fuzz: deps
	@bash scripts/run-fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) build-fuzz
