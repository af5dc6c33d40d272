# Makefile -- the one build for libtb, mod_tbucket and the shim.
#
#   make              build shared/libtb.a, the module and the shim
#   make test         install missing packages, build, run unit + integration
#   make run          install missing packages, build, start the demo
#   make unit | integration | asan | noopt | clean
#
# Our flags live in TB_CFLAGS / TB_LDFLAGS so a caller's CFLAGS / LDFLAGS
# are kept (as hiredis does with HIREDIS_CFLAGS). WERROR=0 turns off
# -Werror; SANITIZER=address,undefined builds a sanitizer variant into its
# own build directory.

CC ?= cc
OPT ?= -O2
WERROR ?= 1
SANITIZER ?=
PYTHON ?= /usr/bin/python3
PYTEST_ARGS ?=
TEST_PREFIX ?=

ifeq ($(SANITIZER),)
BUILD ?= build
else
BUILD ?= build/san
endif

TB_WARN = -Wall -Wextra -Wstrict-prototypes -Wmissing-prototypes \
          -Wwrite-strings -Wshadow
ifeq ($(WERROR),1)
TB_WARN += -Werror
endif
TB_CFLAGS = $(OPT) -g -fPIC -pthread $(TB_WARN)
TB_LDFLAGS = -pthread -lm
ifneq ($(SANITIZER),)
TB_CFLAGS += -fsanitize=$(SANITIZER) -fno-sanitize-recover=all \
             -fno-omit-frame-pointer
TB_LDFLAGS += -fsanitize=$(SANITIZER)
endif

# ---- the core: C99 + POSIX + hiredis, nothing else ---------------------
CORE_CFLAGS = -std=c99 -pedantic -D_POSIX_C_SOURCE=200809L -Ishared -I$(BUILD)
CORE_SRC = $(wildcard shared/*.c)
CORE_OBJ = $(patsubst shared/%.c,$(BUILD)/shared/%.o,$(CORE_SRC)) \
           $(BUILD)/shared/tb_script.o
LIBTB = $(BUILD)/libtb.a
HIREDIS_LIBS = -lhiredis
HIREDIS_STATIC = $(shell pkg-config --variable=libdir hiredis 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)/libhiredis.a

# ---- the module: APR and httpd headers only here ------------------------
APXS ?= $(shell command -v apxs 2>/dev/null || echo /usr/bin/apxs)
MOD_INC = -I$(shell $(APXS) -q INCLUDEDIR 2>/dev/null) \
          $(shell apr-1-config --cflags --cppflags --includes 2>/dev/null) \
          $(shell apu-1-config --includes 2>/dev/null)
MOD_CFLAGS = $(MOD_INC) -Ishared -Wno-missing-field-initializers
MOD_SRC = $(wildcard mod_tbucket/*.c)
MOD_OBJ = $(patsubst mod_tbucket/%.c,$(BUILD)/mod_tbucket/%.o,$(MOD_SRC))
MOD_SO = $(BUILD)/mod_tbucket.so

# ---- the shim: libconfig only here; static hiredis, hidden symbols -----
SHIM_CFLAGS = -D_GNU_SOURCE -Ishared -fvisibility=hidden
SHIM_SRC = $(wildcard shim/*.c)
SHIM_OBJ = $(patsubst shim/%.c,$(BUILD)/shim/%.o,$(SHIM_SRC))
SHIM_SO = $(BUILD)/libtbucket_preload.so

# ---- tools ---------------------------------------------------------------
TOOLS = $(if $(wildcard tools/tbucket.c),$(BUILD)/tbucket) \
        $(if $(wildcard tests/integration/tb_driver.c),$(BUILD)/tb_driver)

UNIT_SRC = $(wildcard tests/unit/test_*.c)
UNIT_BIN = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

.PHONY: all deps test unit integration asan noopt run clean install \
        uninstall bench fuzz
all: $(LIBTB) $(if $(MOD_SRC),$(MOD_SO)) $(if $(SHIM_SRC),$(SHIM_SO)) $(TOOLS)

$(BUILD)/shared/tb_script.c: shared/tb_bucket.lua scripts/embed-lua.sh
	@mkdir -p $(dir $@)
	sh scripts/embed-lua.sh $< > $@.tmp && mv $@.tmp $@

$(BUILD)/shared/tb_script.o: $(BUILD)/shared/tb_script.c
	$(CC) $(CPPFLAGS) $(CORE_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/shared/%.o: shared/%.c shared/tb.h $(wildcard shared/*_int.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CORE_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(LIBTB): $(CORE_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/mod_tbucket/%.o: mod_tbucket/%.c shared/tb.h $(wildcard mod_tbucket/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(MOD_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(MOD_SO): $(MOD_OBJ) $(LIBTB)
	$(CC) -shared -o $@ $(MOD_OBJ) $(LIBTB) $(HIREDIS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/shim/%.o: shim/%.c shared/tb.h $(wildcard shim/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(SHIM_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(SHIM_SO): $(SHIM_OBJ) $(LIBTB) shim/tb_shim.map
	$(CC) -shared -o $@ $(SHIM_OBJ) $(LIBTB) $(HIREDIS_STATIC) \
	    -Wl,--version-script=shim/tb_shim.map -Wl,--exclude-libs,ALL \
	    -lconfig -ldl $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/tbucket: tools/tbucket.c $(LIBTB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared $(TB_CFLAGS) $(CFLAGS) $< -o $@ $(LIBTB) $(HIREDIS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/tb_driver: tests/integration/tb_driver.c $(LIBTB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared $(TB_CFLAGS) $(CFLAGS) $< -o $@ $(LIBTB) $(HIREDIS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/tests/%: tests/unit/%.c $(LIBTB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared $(TB_CFLAGS) -Wno-missing-prototypes $(CFLAGS) $< -o $@ $(LIBTB) -lcmocka $(HIREDIS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

deps:
	@sh scripts/install-deps.sh

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; \
	    TB_TEST_VECTORS=tests/vectors $(TEST_PREFIX) $$t; done

integration: all
	TB_BUILD=$(abspath $(BUILD)) $(PYTHON) -m pytest -q -p no:cacheprovider \
	    tests/integration $(PYTEST_ARGS)

test: deps
	$(MAKE) all
	$(MAKE) unit
	$(MAKE) integration

asan: deps
	$(MAKE) SANITIZER=address,undefined all unit
	$(MAKE) SANITIZER=address,undefined integration TB_ASAN=1

noopt:
	$(MAKE) OPT=-O0 BUILD=build/noopt all

run: deps
	$(MAKE) all
	sh scripts/run.sh $(abspath $(BUILD))

clean:
	rm -rf build
