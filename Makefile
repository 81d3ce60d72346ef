# Two commands on a fresh machine: `make demo` (the main job on the embedded
# sample, headless) and `make test`. Both create .venv and install what they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := xvfb xauth libgl1-mesa-dri libglx-mesa0 libegl1 libxkbcommon-x11-0 \
	libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0 \
	libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xfixes0 libdbus-1-3 libfontconfig1
XVFB := xvfb-run -a -s "-screen 0 1280x1024x24"

.PHONY: demo test test-all bench lint system-deps install clean

# Python's default is back for everything make runs: a machine that sets
# PYTHONDONTWRITEBYTECODE made every pytest process compile the tests, the project and
# the ~540 napari/zarr/npe2 modules pytest assert-rewrites (its plugins' packages) from
# source: collecting the suite took 12.3 s each time, 6.9 s once they are cached.
unexport PYTHONDONTWRITEBYTECODE

# uv installs the same releases as pip, but fetches and byte-compiles in parallel: a fresh
# venv with the test peers took 45 s against pip's 100 s. uv does not read pip's
# configuration, so pip's find-links (where a local CPU build of torch may lie) is passed on.
UV := $(VENV)/bin/uv
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
# pip takes several find-links separated by spaces; uv takes one per option.
UV_INSTALL = $(UV) pip install -q --python $(PY) --compile-bytecode \
	$(foreach link,$(FIND_LINKS),--find-links $(link))

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q uv
	# The CPU build of torch first, so the project's torch range is already met.
	$(UV_INSTALL) torch==2.13.0 || echo "torch 2.13.0 not available here; uv will choose one"
	$(UV_INSTALL) -e ".[dev]"
	touch $@

# Test peers that cannot come through pyproject (only `make test` needs them).
$(VENV)/.test-peers: $(VENV)/.installed
	# torch-em for the tests of its models. Its declared requirements would replace the
	# CPU torch and bring a torchvision that cannot load beside it, so torch-em comes
	# without dependencies, plus what `import torch_em.model` needs; torchvision goes to
	# a side folder that only tests/third_party.py puts on sys.path (transformers, which
	# PEFT imports, imports any torchvision it finds).
	$(UV_INSTALL) scikit-learn kornia bioimage-cpp
	$(UV_INSTALL) --no-deps torch-em python-elf
	$(UV_INSTALL) --no-deps --target $(VENV)/torch-em-deps torchvision==0.28.0
	touch $@

install: $(VENV)/.installed

# Headless napari needs Xvfb + Mesa; installed when missing and we are root.
system-deps:
	@if command -v xvfb-run >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/libxcb-cursor.so.0 -o -e /usr/lib/aarch64-linux-gnu/libxcb-cursor.so.0 ]; then \
		echo "system packages present"; \
	elif [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -q $(APT_PACKAGES) || (apt-get update -q && apt-get install -y -q $(APT_PACKAGES))) >/dev/null; \
	else \
		echo "missing Xvfb/Mesa: sudo apt-get install -y $(APT_PACKAGES)"; exit 1; \
	fi

demo: $(VENV)/.installed
	$(VENV)/bin/napari-finetune demo

# The whole suite on Qt 5 (qtpy's first choice), then the widget tests again on Qt 6
# (of the napari-process shutdown cases, ~17 s each, the two that lost work before; not
# the stores read by the napari-ome-zarr plugin: another reader, the same on both).
# Each run: every test that may share a moment with another on $(JOBS) xdist workers;
# beside them, in one more pytest process, the tests marked `resource` one after another
# (DDP ports, the dask cluster, signalled or SIGKILLed children: each needs its resource
# to itself, not a quiet machine; its log is printed after the parallel run's); then the
# tests marked `serial` alone (bounds on wall time or stalls, torch's thread count).
# (xdist_group + --dist loadgroup would keep them on one worker, but under pytest 9.2
# loadgroup silently stops grouping: pytest-xdist issue 1386.) --durations names the
# slowest tests.
QT6_SKIP := quit-mid-run or remove-dock-mid-run or close-then-exit or dask_worker \
	or napari_ome_zarr
JOBS ?= 2
# Extra options for every pytest call, e.g. PYTEST_ARGS=--random-order-seed=7 (a shuffled
# order: no test may depend on another's leftovers) or PYTEST_ARGS=-x.
PYTEST_ARGS ?=
PYTEST = $(PY) -m pytest $(PYTEST_ARGS)
PARALLEL := -n $(JOBS) --durations=15
QT6 := QT_API=pyqt6 PYTEST_QT_API=pyqt6
RESOURCE_LOG := .pytest_cache/resource-tests.log
CHECK_LOG := .pytest_cache/type-check.log
# $(call beside,MARKS,PARALLEL MARKS[,CHECK]): the `resource` tests of MARKS in the
# background, and CHECK (a command) beside them, the parallel run in front; fails when
# any does. The type check goes here rather than before: on a clean clone mypy has no
# cache and takes ~28 s of one core (57 s before pyproject's skipped modules), which
# the resource tests' waits (cluster start-up, children signalled) leave free; alone in
# front it made .ci/run 508 s.
beside = mkdir -p .pytest_cache; check=; \
	$(if $(3),$(3) > $(CHECK_LOG) 2>&1 & check=$$!;) \
	QT_QPA_PLATFORM=offscreen $(PYTEST) --durations=15 -m "resource and $(1)" \
		> $(RESOURCE_LOG) 2>&1 & resource=$$!; \
	trap 'kill $$resource $$check 2>/dev/null' INT TERM; \
	$(XVFB) $(PYTEST) $(PARALLEL) -m "not resource and $(2)"; parallel=$$?; \
	wait $$resource; resource_rc=$$?; cat $(RESOURCE_LOG); check_rc=0; \
	if [ -n "$$check" ]; then wait $$check; check_rc=$$?; echo "type check (beside the tests):"; cat $(CHECK_LOG); fi; \
	test $$parallel = 0 && test $$resource_rc = 0 && test $$check_rc = 0
test: system-deps $(VENV)/.installed $(VENV)/.test-peers
	$(VENV)/bin/ruff check src tests benchmarks sample_data
	$(VENV)/bin/lint-imports
	$(call beside,not slow and not serial,not slow and not serial,$(PY) -m mypy)
	$(XVFB) $(PYTEST) --durations=15 -m "serial and not slow"
	$(QT6) $(XVFB) $(PYTEST) tests/_qt $(PARALLEL) -m "not slow and not serial" \
		-k "not ($(QT6_SKIP))"
	$(QT6) $(XVFB) $(PYTEST) tests/_qt -m "serial and not slow" -k "not ($(QT6_SKIP))"

# Before a release: everything, the slow end-to-end tests too, the same three ways.
test-all: system-deps $(VENV)/.installed $(VENV)/.test-peers
	$(call beside,not serial,not serial)
	$(XVFB) $(PYTEST) --durations=15 -m "serial"

# Re-measure docs/benchmarks.md: every benchmark in a few minutes, each table under a
# line naming the commit, date, machine and load average (benchmarks/run_all.py).
bench: $(VENV)/.installed
	$(PY) benchmarks/run_all.py --quick

clean:
	rm -rf $(VENV) .pytest_cache
