# SPDX-License-Identifier: MIT
# kvbroker: one non-recursive Makefile.
#
#   make              build everything (release, build/release/)
#   make test         unit + integration tests
#   make demo         start a broker, run two simulated engines, print what happened
#   make bench        kvbbench figures into docs/benchmarks.md (QUICK=1: a short smoke run)
#   make asan|tsan    the test suites under AddressSanitizer+UBSan / ThreadSanitizer
#   make lint         clang-format check, cppcheck
#   make install      PREFIX=/usr/local DESTDIR=
#   V=1 shows commands; MODE=debug|asan|tsan selects the build flavour.

MODE ?= release
PREFIX ?= /usr/local
DESTDIR ?=
CC ?= cc
CFLAGS ?= -O2 -g
B := build/$(MODE)

ifeq ($(V),1)
Q :=
else
Q := @
endif

PKGS := liburing numa libcrypto libcjson
WARN := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wformat=2 -Wvla \
	-Wimplicit-fallthrough -Wcast-qual -Wwrite-strings -Wundef
ifneq ($(CI),)
WARN += -Werror
endif
ifeq ($(WERROR),1)
WARN += -Werror
endif

override CFLAGS += -std=gnu11 -fPIC -pthread $(WARN) -Iinclude -Iproto -D_GNU_SOURCE
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

DEPS_STAMP := build/.deps-ok
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)
override CFLAGS += $(PKG_CFLAGS)

PROTO_SRC := $(wildcard proto/*.c)
CLIENT_SRC := $(wildcard client/*.c)
BROKER_SRC := $(filter-out broker/main.c,$(wildcard broker/*.c))
UNIT_SRC := $(wildcard tests/unit/test_*.c)
INTEG_SRC := $(wildcard tests/integ/t_*.c)
HARNESS_SRC := $(filter-out tests/integ/t_%.c,$(wildcard tests/integ/*.c))

obj = $(patsubst %.c,$(B)/obj/%.o,$(1))

LIB_A := $(B)/lib/libkvbroker.a
LIB_SO := $(B)/lib/libkvbroker.so
BROKER_A := $(B)/lib/libbrokercore.a
BROKERD := $(B)/bin/kvbrokerd
KVBCTL := $(B)/bin/kvbctl
KVBBENCH := $(B)/bin/kvbbench
KVBDEMO := $(B)/bin/kvbdemo
UNIT_BINS := $(patsubst tests/unit/%.c,$(B)/tests/%,$(UNIT_SRC))
INTEG_BINS := $(patsubst tests/integ/%.c,$(B)/tests/%,$(INTEG_SRC))
PROGS := $(BROKERD) $(KVBCTL) $(KVBBENCH) $(KVBDEMO)

.PHONY: all deps test unit integ demo bench asan tsan lint format install clean soak
.DEFAULT_GOAL := all
# Keep every object: pattern chains would otherwise delete some as intermediates.
.SECONDARY:

all: $(PROGS) $(LIB_A) $(LIB_SO) $(UNIT_BINS) $(INTEG_BINS)

# Every target needs the Debian packages: check once, install when root, else say what to run.
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

$(LIB_A): $(call obj,$(CLIENT_SRC) $(PROTO_SRC))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(call obj,$(CLIENT_SRC) $(PROTO_SRC)) client/libkvbroker.map
	@mkdir -p $(@D)
	$(Q)$(CC) -shared -o $@ $(call obj,$(CLIENT_SRC) $(PROTO_SRC)) $(LDFLAGS) \
		-Wl,--version-script=client/libkvbroker.map -Wl,-soname,libkvbroker.so.0 \
		-pthread $(shell pkg-config --libs libcrypto) -ldl

$(BROKER_A): $(call obj,$(BROKER_SRC) $(PROTO_SRC))
	@mkdir -p $(@D)
	$(Q)rm -f $@ && ar rcs $@ $^

LIBS := $(PKG_LIBS) -pthread -ldl -lrt -lm

$(BROKERD): $(call obj,broker/main.c) $(BROKER_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/bin/%: $(B)/obj/tools/%.o $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(B)/tests/test_%: $(B)/obj/tests/unit/test_%.o $(BROKER_A) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(BROKER_A) $(LIB_A) $(LIBS) -lcmocka

$(B)/tests/t_%: $(B)/obj/tests/integ/t_%.o $(call obj,$(HARNESS_SRC)) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

test: all
	$(Q)sh tests/run.sh $(B)

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

$(KVBBENCH): $(call obj,$(KVBBENCH_SRC)) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(KVBPEERS): $(call obj,$(filter-out tools/kvbbench/table.c,$(KVBB_SRC))) $(LIB_A)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(LIBS) $(shell pkg-config --libs $(PEER_PKGS))

# Bench-only packages (Redis, memcached, their client libraries, fio, gnuplot) are installed
# here, not by the deps every other target needs.
bench: $(PROGS)
	$(Q)sh tools/deps.sh bench
	$(Q)$(MAKE) --no-print-directory $(KVBPEERS)
	$(Q)KVB_BENCH_QUICK=$(QUICK) sh tools/bench.sh $(B)

asan:
	$(Q)$(MAKE) --no-print-directory MODE=asan test

tsan:
	$(Q)$(MAKE) --no-print-directory MODE=tsan test

lint:
	$(Q)clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')
	$(Q)cppcheck --quiet --error-exitcode=1 --enable=warning,portability \
		--suppress=missingIncludeSystem -Iinclude -Iproto $$(git ls-files '*.c')

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
	sed -e 's|@PREFIX@|$(PREFIX)|' client/kvbroker.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvbroker.pc

clean:
	rm -rf build

-include $(shell find $(B) -name '*.d' 2>/dev/null)
