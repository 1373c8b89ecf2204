# Root convenience targets. Everything is built by CMake into build/.
BUILD ?= build
JOBS  ?= $(shell nproc)

.PHONY: all deps demo test bench clean
all:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

deps:
	@bash scripts/install-deps.sh

demo: deps all
	@python3 bench/demo.py

test: deps all
	@python3 -m pytest -q tests

bench: deps all
	@$(BUILD)/bin/sdp bench

clean:
	rm -rf $(BUILD)
