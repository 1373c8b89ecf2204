# Root convenience targets. Everything is built by CMake into build/.
BUILD ?= build
JOBS  ?= $(shell nproc)

.PHONY: all deps demo test bench clean fuzz soak
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash scripts/install-deps.sh

demo: deps all
	@python3 bench/demo.py

test: deps all
	@python3 -m pytest -q tests

# Longer fuzzing than `make test` does: FUZZ_SECONDS per target, corpus kept
# in $(BUILD)/fuzz/corpus-TARGET between runs (docs/TESTING.md).
FUZZ_SECONDS ?= 300
fuzz: deps
	@bash tests/fuzz/run.sh $(BUILD)/fuzz $(FUZZ_SECONDS)

# Soak and fault campaign (not part of `make test`; docs/TESTING.md).
SOAK_ARGS ?=
soak: deps all
	@python3 tests/soak/soak.py $(SOAK_ARGS)
	@python3 tests/soak/faults.py --trials 300

bench: deps all
	@$(BUILD)/bin/sdp bench

clean:
	rm -rf $(BUILD)
