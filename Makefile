# Front door: `make run` and `make test` work on a fresh machine (setup is idempotent).
PRESET ?= default
JOBS ?= $(shell nproc)

.PHONY: all setup build run test clean

all: build

setup:
	@scripts/setup.sh

build: setup
	@cmake --preset $(PRESET) >/dev/null
	@cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	@scripts/run.sh

test: build
	@scripts/test.sh

clean:
	rm -rf build
