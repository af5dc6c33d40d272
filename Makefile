# Makefile -- the one build for libtb, mod_tbucket and the shim.
#
#   make              build shared/libtb.a, the module and the shim
#   make test         install missing packages, build, run unit + integration
#                     (NOISE=1: beside one busy loop per CPU; also make asan)
#   make run          install missing packages, build, start the demo
#   make deb          Debian packages into $(BUILD)/deb (scripts/build-deb.sh)
#   make unit | integration | asan | noopt | clean
#   make soak         hours under faults (bench/soak.py; SOAK_MIN, SAN=1)
#   make progs        only the test programs tests/integration runs
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

# ---- the core: C99 + POSIX + hiredis + OpenSSL, nothing else -----------
# shared/ in layers (shared/README.md): base/, algo/ and redis/ below, the
# decision path at the top. Objects mirror the folders under
# $(BUILD)/shared/; the script table generated from algo/'s Lua is
# $(BUILD)/shared/algo/tb_script.c.
CORE_CFLAGS = -std=c99 -pedantic -D_POSIX_C_SOURCE=200809L -Ishared -I$(BUILD)
CORE_SRC = $(wildcard shared/*.c shared/*/*.c)
# The public header is tb.h and the parts it includes (tables, bans,
# known clients).
TB_PUBLIC = shared/tb.h shared/tb_tables.h shared/tb_bans.h shared/tb_known.h \
            shared/tb_coalesce.h
CORE_HDR = $(TB_PUBLIC) $(wildcard shared/*_int.h shared/*/*.h)
TB_SCRIPT_C = $(BUILD)/shared/algo/tb_script.c
CORE_OBJ = $(patsubst shared/%.c,$(BUILD)/shared/%.o,$(CORE_SRC)) \
           $(TB_SCRIPT_C:.c=.o)
LIBTB = $(BUILD)/libtb.a

# The script bodies in tb_algo_t order: the token bucket first. Each ships
# as LUA_PRELUDE followed by its body; embed-lua.sh joins them into
# $(BUILD)/lua/ (the texts the tests run) and embeds those texts.
LUA_PRELUDE = shared/algo/tb_prelude.lua
ALGO_LUA = shared/algo/tb_bucket.lua shared/algo/tb_gcra.lua \
           shared/algo/tb_swindow.lua shared/algo/tb_fwindow.lua \
           shared/algo/tb_slog.lua
ALGO_LUA_BUILT = $(patsubst shared/algo/%,$(BUILD)/lua/%,$(ALGO_LUA))

HIREDIS_LIBS = -lhiredis
# TLS to Redis (shared/redis/tb_tls.c) and SHA-256 (shared/base/tb_digest.c):
# every program that links libtb links these too, the shim included
# (shared libssl; only hiredis is static).
TLS_LIBS = -lssl -lcrypto
# Debian's hiredis.pc says libdir=/usr/lib, but the archive is multiarch.
HIREDIS_STATIC = $(firstword $(wildcard \
    $(shell pkg-config --variable=libdir hiredis 2>/dev/null)/libhiredis.a \
    /usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null)/libhiredis.a) \
    /usr/lib/x86_64-linux-gnu/libhiredis.a)

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

# ---- the Redis module: the scripts' decisions as tbucket.* commands -----
# redismod/ compiled with the core's pure twins (no hiredis, no I/O), into
# one .so that exports RedisModule_OnLoad alone (tbucket_redis.map). Its
# version for MODULE LIST is VERSION as major*10000 + minor*100 + patch.
RM_VERSION := $(shell awk -F. '{ print $$1 * 10000 + $$2 * 100 + $$3 }' \
    VERSION 2>/dev/null)
RM_CFLAGS = -std=c99 -D_POSIX_C_SOURCE=200809L -Ishared -Iredismod \
            -DTBUCKET_REDIS_VERSION=$(or $(RM_VERSION),1)
RM_SRC = $(wildcard redismod/*.c)
RM_OBJ = $(patsubst redismod/%.c,$(BUILD)/redismod/%.o,$(RM_SRC))
RM_TWINS = algo/tb_bucket algo/tb_gcra algo/tb_fwindow algo/tb_swindow \
           algo/tb_slog algo/tb_algo base/tb_cnum base/tb_names
RM_CORE_OBJ = $(patsubst %,$(BUILD)/shared/%.o,$(RM_TWINS))
RM_SO = $(BUILD)/tbucket_redis.so
REDIS_MODDIR ?= /usr/lib/redis/modules

# ---- tools ---------------------------------------------------------------
# tools/ (tools/README.md): the tbucket command, one file per job. It reads
# shim configurations with the shim's own loader, built from shim/ as
# libtbshimconf.a so that both accept the same files. SHIMCONF names the
# loader's files (shim/README.md), also replayed by the shimconf fuzz target.
TOOLS = $(if $(wildcard tools/tbucket.c),$(BUILD)/tbucket)
TOOL_SRC = $(wildcard tools/*.c)
TOOL_OBJ = $(patsubst tools/%.c,$(BUILD)/tools/%.o,$(TOOL_SRC))
SHIMCONF = shim_conf shim_conf_table
SHIMCONF_LIB = $(BUILD)/libtbshimconf.a

# ---- test programs: every program tests/integration runs, built here ----
# Sources in tests/integration/progs/, programs in $(BUILD)/progs/.
TPROG_SRC = tests/integration/progs
TPROG = $(BUILD)/progs
# The drivers link libtb, built like the module and the shim (sanitizer
# included): tb_driver speaks a line protocol to one client, tb_algo_driver
# runs one algorithm, tb_batch runs many threads on one client.
TPROG_DRIVERS = $(TPROG)/tb_driver $(TPROG)/tb_algo_driver $(TPROG)/tb_batch
# The shim tests' programs stand in for the legacy applications the shim is
# preloaded into, which are not sanitizer builds: plain in every build.
# tb_cli2 is a copy of tb_cli, since a "$program" key must differ by name.
TPROG_PLAIN = $(TPROG)/tb_srv $(TPROG)/tb_cli $(TPROG)/closer \
              $(TPROG)/connect_loop $(TPROG)/prefork_srv $(TPROG)/thread_srv
TPROG_LIBS = $(TPROG)/libctor.so $(TPROG)/libfakeconnect.so
TPROG_CFLAGS = $(OPT) -g -pthread $(TB_WARN)
# Replays of the fuzz corpus: each tests/fuzz/fuzz_<name>.c linked with
# replay_main.c instead of libFuzzer, so gcc suffices; always ASan + UBSan,
# as the fuzz targets are. The core is compiled once for all of them.
REPLAY_TARGETS = url key parse call $(if $(wildcard shim/shim_conf.c),shimconf) \
                 $(if $(wildcard redismod/rm_command.c),rmcall) \
                 $(if $(wildcard mod_tbucket/tbucket_form_parse.c),form)
REPLAY_BIN = $(patsubst %,$(BUILD)/fuzz/replay_%,$(REPLAY_TARGETS))
REPLAY_CFLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                -fno-sanitize-recover=all -D_GNU_SOURCE -Ishared -Ishim \
                -I$(BUILD)
REPLAY_DIR = $(BUILD)/fuzz/replay-obj
REPLAY_CORE = $(patsubst shared/%.c,$(REPLAY_DIR)/shared/%.o,$(CORE_SRC)) \
              $(REPLAY_DIR)/shared/algo/tb_script.o \
              $(REPLAY_DIR)/replay_main.o
# dl_main loads a plugin found only through its RUNPATH ($ORIGIN/plug), as
# PHP loads extensions: the shim's dlopen() must keep the caller's identity.
TPROG_DL = $(TPROG)/dl_main $(TPROG)/plug/libtbplug.so
# form_read runs the module's form reader on a test's bodies (beside PHP).
TEST_PROGS = $(TPROG_DRIVERS) $(TPROG_PLAIN) $(TPROG_LIBS) $(TPROG_DL) \
             $(TPROG)/ctor_main $(TPROG)/tb_cli2 $(REPLAY_BIN) \
             $(TPROG)/form_read

UNIT_SRC = $(wildcard tests/unit/test_*.c)
UNIT_BIN = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))

.PHONY: all deps test unit integration asan noopt run clean install \
        uninstall bench fuzz deb progs soak
# What ships; the test programs are built by `make progs` (and before the
# integration tests), so a package build compiles none of them.
all: $(ALGO_LUA_BUILT) $(LIBTB) $(if $(MOD_SRC),$(MOD_SO)) \
     $(if $(SHIM_SRC),$(SHIM_SO)) $(TOOLS) $(if $(RM_SRC),$(RM_SO))

progs: $(TEST_PROGS)

$(TB_SCRIPT_C) $(ALGO_LUA_BUILT) &: $(LUA_PRELUDE) $(ALGO_LUA) \
    scripts/embed-lua.sh Makefile
	@mkdir -p $(dir $(TB_SCRIPT_C))
	sh scripts/embed-lua.sh $(BUILD)/lua $(LUA_PRELUDE) $(ALGO_LUA) \
	    > $(TB_SCRIPT_C).tmp
	mv $(TB_SCRIPT_C).tmp $(TB_SCRIPT_C)

$(TB_SCRIPT_C:.c=.o): $(TB_SCRIPT_C) $(CORE_HDR)
	$(CC) $(CPPFLAGS) $(CORE_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/shared/%.o: shared/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CORE_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(LIBTB): $(CORE_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/mod_tbucket/%.o: mod_tbucket/%.c $(TB_PUBLIC) $(wildcard mod_tbucket/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(MOD_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(MOD_SO): $(MOD_OBJ) $(LIBTB)
	$(CC) -shared -o $@ $(MOD_OBJ) $(LIBTB) $(HIREDIS_LIBS) $(TLS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/shim/%.o: shim/%.c $(TB_PUBLIC) $(wildcard shim/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(SHIM_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(SHIM_SO): $(SHIM_OBJ) $(LIBTB) shim/tb_shim.map
	$(CC) -shared -o $@ $(SHIM_OBJ) $(LIBTB) $(HIREDIS_STATIC) \
	    -Wl,--version-script=shim/tb_shim.map -Wl,--exclude-libs,ALL \
	    -lconfig -ldl $(TLS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

$(BUILD)/redismod/%.o: redismod/%.c $(wildcard redismod/*.h) $(TB_PUBLIC) \
    shared/algo/tb_algo_int.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(RM_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

# The module's version is compiled in (RM_VERSION): a new VERSION rebuilds it.
$(BUILD)/redismod/tbucket_redis.o: VERSION

$(RM_SO): $(RM_OBJ) $(RM_CORE_OBJ) redismod/tbucket_redis.map
	$(CC) -shared -o $@ $(RM_OBJ) $(RM_CORE_OBJ) \
	    -Wl,--version-script=redismod/tbucket_redis.map $(TB_LDFLAGS) $(LDFLAGS)

# The Redis module alone, for its Debian package (debian/rules). Mode 755:
# Redis 7 refuses to load a module file that nobody may execute.
.PHONY: install-redismod
install-redismod: $(RM_SO)
	$(INSTALL) -d "$(DESTDIR)$(REDIS_MODDIR)"
	$(INSTALL) -m 755 $(RM_SO) "$(DESTDIR)$(REDIS_MODDIR)/tbucket_redis.so"

$(BUILD)/tools/%.o: tools/%.c tools/tbucket_tool.h $(TB_PUBLIC) shim/tb_shim.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared -Ishim $(TB_CFLAGS) $(CFLAGS) -c $< -o $@

$(SHIMCONF_LIB): $(patsubst %,$(BUILD)/shim/%.o,$(SHIMCONF))
	rm -f $@
	ar rcs $@ $^

$(BUILD)/tbucket: $(TOOL_OBJ) $(SHIMCONF_LIB) $(LIBTB)
	$(CC) -o $@ $(TOOL_OBJ) $(SHIMCONF_LIB) $(LIBTB) $(HIREDIS_LIBS) $(TLS_LIBS) -lconfig $(TB_LDFLAGS) $(LDFLAGS)

$(TPROG_DRIVERS): $(TPROG)/%: $(TPROG_SRC)/%.c $(LIBTB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared $(TB_CFLAGS) $(CFLAGS) $< -o $@ $(LIBTB) $(HIREDIS_LIBS) $(TLS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)
$(TPROG)/tb_driver $(TPROG)/tb_batch: $(TPROG_SRC)/driver_common.h
$(TPROG)/prefork_srv $(TPROG)/thread_srv: $(TPROG_SRC)/progs_listen.h
$(TPROG)/tb_driver: $(TPROG_SRC)/driver_rules.h

$(TPROG_PLAIN): $(TPROG)/%: $(TPROG_SRC)/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS)

$(TPROG)/form_read: $(TPROG_SRC)/form_read.c mod_tbucket/tbucket_form_parse.c \
    mod_tbucket/tbucket_form_parse.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) -Imod_tbucket $(CFLAGS) \
	    $(filter %.c,$^) -o $@ $(LDFLAGS)

$(TPROG)/libctor.so: $(TPROG_SRC)/ctor_lib.c
$(TPROG)/libfakeconnect.so: $(TPROG_SRC)/fake_connect.c
$(TPROG_LIBS):
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) -fPIC $(CFLAGS) -shared $^ -o $@ $(LDFLAGS)

# ctor_main calls the shim from libctor.so's constructor, found beside it.
$(TPROG)/ctor_main: $(TPROG_SRC)/ctor_main.c $(TPROG)/libctor.so
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) $(CFLAGS) $< -o $@ -L$(TPROG) -lctor \
	    -Wl,-rpath,'$$ORIGIN' $(LDFLAGS)

$(TPROG)/plug/libtbplug.so: $(TPROG_SRC)/dl_plugin.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) -fPIC $(CFLAGS) -shared $< -o $@ $(LDFLAGS)

$(TPROG)/dl_main: $(TPROG_SRC)/dl_main.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(TPROG_CFLAGS) $(CFLAGS) $< -o $@ -ldl \
	    -Wl,--enable-new-dtags,-rpath,'$$ORIGIN/plug' $(LDFLAGS)

$(TPROG)/tb_cli2: $(TPROG)/tb_cli
	cp $< $@

$(REPLAY_DIR)/shared/%.o: shared/%.c $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -c $< -o $@

$(REPLAY_DIR)/shared/algo/tb_script.o: $(TB_SCRIPT_C) $(CORE_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -c $< -o $@

$(REPLAY_DIR)/%.o: tests/fuzz/%.c tests/fuzz/fuzz_common.h $(TB_PUBLIC)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -c $< -o $@

$(REPLAY_DIR)/%.o: shim/%.c $(TB_PUBLIC) $(wildcard shim/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -c $< -o $@

$(REPLAY_DIR)/%.o: redismod/%.c $(TB_PUBLIC) $(wildcard redismod/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -Iredismod -c $< -o $@

$(BUILD)/fuzz/replay_%: $(REPLAY_DIR)/fuzz_%.o $(REPLAY_CORE)
	$(CC) $(REPLAY_CFLAGS) -o $@ $< $(REPLAY_EXTRA) $(REPLAY_CORE) \
	    -lhiredis $(TLS_LIBS) -lm -pthread $(REPLAY_LIBS)

REPLAY_SHIMCONF = $(patsubst %,$(REPLAY_DIR)/%.o,$(SHIMCONF))
$(BUILD)/fuzz/replay_shimconf: $(REPLAY_SHIMCONF)
$(BUILD)/fuzz/replay_shimconf: REPLAY_EXTRA = $(REPLAY_SHIMCONF)
$(BUILD)/fuzz/replay_shimconf: REPLAY_LIBS = -lconfig -ldl
$(REPLAY_DIR)/fuzz_shimconf.o: $(wildcard shim/*.h)
$(REPLAY_DIR)/%.o: mod_tbucket/%.c $(wildcard mod_tbucket/*_parse.h)
	@mkdir -p $(dir $@)
	$(CC) $(REPLAY_CFLAGS) -Imod_tbucket -c $< -o $@

$(BUILD)/fuzz/replay_form: $(REPLAY_DIR)/tbucket_form_parse.o
$(BUILD)/fuzz/replay_form: REPLAY_EXTRA = $(REPLAY_DIR)/tbucket_form_parse.o
$(REPLAY_DIR)/fuzz_form.o: REPLAY_CFLAGS += -Imod_tbucket
$(REPLAY_DIR)/fuzz_form.o: mod_tbucket/tbucket_form_parse.h
$(BUILD)/fuzz/replay_rmcall: $(REPLAY_DIR)/rm_command.o
$(BUILD)/fuzz/replay_rmcall: REPLAY_EXTRA = $(REPLAY_DIR)/rm_command.o
$(REPLAY_DIR)/fuzz_rmcall.o: REPLAY_CFLAGS += -Iredismod
$(REPLAY_DIR)/fuzz_rmcall.o: $(wildcard redismod/*.h)
# Kept between builds (make would delete them as intermediate files).
.SECONDARY: $(REPLAY_CORE) $(REPLAY_SHIMCONF) $(REPLAY_DIR)/rm_command.o \
    $(REPLAY_DIR)/tbucket_form_parse.o \
    $(patsubst %,$(REPLAY_DIR)/fuzz_%.o,$(REPLAY_TARGETS))

# The algorithm unit tests share their vector reader.
$(patsubst %,$(BUILD)/tests/test_%,gcra fwindow swindow slog twin_store): \
    tests/unit/algo_vectors.h
# unit_common.h: requests, guarded table memory, threads and children.
$(patsubst %,$(BUILD)/tests/test_%,adapt call client inflight lease local shlock slog \
    topk): tests/unit/unit_common.h

# test_local halts a holder inside the table's lock, in tb_bucket_take.
$(BUILD)/tests/test_local: UNIT_WRAP = -Wl,--wrap=tb_bucket_take

$(BUILD)/tests/%: tests/unit/%.c $(LIBTB)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) -D_GNU_SOURCE -Ishared $(TB_CFLAGS) -Wno-missing-prototypes $(CFLAGS) $< -o $@ $(UNIT_WRAP) $(LIBTB) -lcmocka $(HIREDIS_LIBS) $(TLS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

deps:
	@sh scripts/install-deps.sh

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do echo "== $$t"; \
	    TB_TEST_VECTORS=tests/vectors $(TEST_PREFIX) $$t; done

# --durations: the slowest tests, printed at the end, so that a run shows
# where the suite's time (about 15 minutes is the budget) goes.
integration: all progs
	sh scripts/fetch-php.sh
	TB_BUILD=$(abspath $(BUILD)) $(PYTHON) -m pytest -q -p no:cacheprovider \
	    --durations=25 tests/integration $(PYTEST_ARGS)

# NOISE=1 runs the tests (unit and integration) beside one CPU-bound busy
# loop per core (nproc) at nice 0, as on a shared CI runner, so that a test
# which holds only on an idle machine fails here rather than there. The
# recipe's shell starts the loops, keeps their PIDs and stops exactly those
# on its way out (the EXIT trap), whether the tests passed or failed; it
# kills with SIGTERM, which a background job of sh does not ignore.
NOISE ?=
comma := ,
with_noise = pids=; trap 'kill $$pids 2>/dev/null; wait $$pids 2>/dev/null' \
    EXIT; trap 'exit 130' INT; trap 'exit 143' TERM; \
    if [ "$(NOISE)" = 1 ]; then \
        for i in $$(seq $$(nproc)); do \
            (while :; do :; done) & pids="$$pids $$!"; \
        done; \
        echo "NOISE=1: $$(nproc) busy loops beside the tests, PIDs$$pids"; \
    fi; $(1)

test: deps
	$(MAKE) all
	@$(call with_noise,$(MAKE) unit && $(MAKE) integration)

# The shim tests preload the plain shim (build/) into programs that fail
# with libasan preloaded (curl, php-cgi), so it is built first.
asan: deps
	$(MAKE) $(SHIM_SO)
	$(MAKE) SANITIZER=address,undefined all
	@$(call with_noise,$(MAKE) SANITIZER=address$(comma)undefined unit && \
	    $(MAKE) SANITIZER=address$(comma)undefined integration TB_ASAN=1)

noopt:
	$(MAKE) OPT=-O0 BUILD=build/noopt all

# libFuzzer targets (tests/fuzz/), FUZZ_TIME seconds each; needs clang and
# libclang-rt-14-dev. Crash inputs land in $(BUILD)/fuzz/artifacts/.
FUZZ_TIME ?= 25
# Configs for the apache2 -t fuzz of the directive handlers.
DIRECTIVE_FUZZ ?= 3000
fuzz: $(TB_SCRIPT_C)
	@sh scripts/install-deps.sh clang libclang-rt-14-dev
	sh tests/fuzz/run.sh $(BUILD) $(FUZZ_TIME) $(FUZZ_TARGETS)
	$(MAKE) all
	TB_BUILD=$(abspath $(BUILD)) TB_DIRECTIVE_FUZZ=$(DIRECTIVE_FUZZ) \
	    $(PYTHON) -m pytest -q -p no:cacheprovider \
	    tests/integration/module/test_directive_fuzz.py

run: deps
	$(MAKE) all
	sh scripts/run.sh $(abspath $(BUILD))

# The floor module (bench/mod_floor.c): one blocking PING per request,
# built like the module and linked against hiredis, never installed.
BENCH_FLOOR_SO = $(BUILD)/bench/mod_floor.so

$(BENCH_FLOOR_SO): bench/mod_floor.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(MOD_CFLAGS) $(TB_CFLAGS) $(CFLAGS) -shared $< -o $@ \
	    $(HIREDIS_LIBS) $(TB_LDFLAGS) $(LDFLAGS)

# Benchmarks (bench/README.md), never part of make test: under 10 minutes,
# writes bench/results/latest.tsv and prints the table. A part whose .so
# does not build is reported as not measured.
bench:
	@sh scripts/install-deps.sh python3-flask gunicorn valgrind strace \
	    linux-perf
	-$(MAKE) all $(BENCH_FLOOR_SO)
	$(PYTHON) bench/run.py --build $(abspath $(BUILD)) $(BENCH_ARGS)
	$(PYTHON) bench/conc.py --build $(abspath $(BUILD))
	$(PYTHON) bench/rules_bench.py --build $(abspath $(BUILD))
	-$(PYTHON) bench/redismod_bench.py --build $(abspath $(BUILD))
	-$(PYTHON) bench/capacity.py --build $(abspath $(BUILD))
	$(PYTHON) bench/overload.py --build $(abspath $(BUILD))
	-$(PYTHON) bench/walk.py --build $(abspath $(BUILD))

# The soak (bench/soak.py, never part of make test): the deployment of
# two replicas behind haproxy, Redis with the module and the shim, under
# steady load with a fault every minute, sampled every 10 s and judged
# on crashes, memory, descriptors, Redis keys, limits and lost requests.
# SOAK_MIN sets the length in minutes (30; 10 with SAN=1, which runs the
# sanitizer build in build/san; SOAK_MINUTES, its older name, still
# works). Figures, report.md and soak.png land in build/results/soak/
# (soak_san/); the exit status is the verdict.
SOAK_MINUTES ?=
SOAK_MIN ?= $(SOAK_MINUTES)
SAN ?=
soak: deps
ifeq ($(SAN),1)
	$(MAKE) SANITIZER=address,undefined all progs
else
	$(MAKE) all progs
endif
	sh scripts/fetch-php.sh
	$(PYTHON) bench/soak.py $(if $(filter 1,$(SAN)),--san) \
	    $(if $(SOAK_MIN),--minutes $(SOAK_MIN))

clean:
	rm -rf build

# Debian packages (debian/, VERSION) built by dpkg-buildpackage in a copy
# of the tracked tree under $(BUILD)/deb/src; the .deb files land in
# $(BUILD)/deb. DEB_JOBS sets the parallel jobs (default 2).
deb: deps
	sh scripts/build-deb.sh $(abspath $(BUILD))/deb

# ---- install / uninstall (apxs conventions, DESTDIR for staging) ---------
# Layout (docs/install.md): the module in `apxs -q LIBEXECDIR`, Debian's
# tbucket.load / tbucket.conf in `apxs -q SYSCONFDIR`/mods-available for
# `a2enmod tbucket`, the shim in LIBDIR (multiarch under PREFIX=/usr), the
# tool in BINDIR, man pages generated from docs/reference.txt in MANDIR.
# Configuration files are never overwritten: an existing one gets a .dist
# copy beside it. `make uninstall` keeps them unless PURGE=1.
PREFIX ?= /usr/local
DESTDIR ?=
INSTALL ?= install
LIBEXECDIR ?= $(shell $(APXS) -q LIBEXECDIR 2>/dev/null || echo /usr/lib/apache2/modules)
APACHE_CONFDIR ?= $(shell $(APXS) -q SYSCONFDIR 2>/dev/null || echo /etc/apache2)
ifeq ($(PREFIX),/usr)
LIBDIR ?= /usr/lib/$(shell $(CC) -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
else
LIBDIR ?= $(PREFIX)/lib
endif
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(PREFIX)/share/man
DOCDIR ?= $(PREFIX)/share/doc/mod_tbucket
TB_CONFDIR ?= /etc/tbucket
PURGE ?= 0
MAN_PAGES = $(BUILD)/man/mod_tbucket.5 $(BUILD)/man/tbucket-shim.5 \
            $(BUILD)/man/tbucket.8

.PHONY: man demo-replicas
man: $(MAN_PAGES)

$(MAN_PAGES) &: docs/reference.txt docs/gen_man.py
	$(PYTHON) docs/gen_man.py docs/reference.txt $(BUILD)/man

# install_conf SRC DEST: install a config file unless DEST exists.
install_conf = if [ -e "$(2)" ]; then \
        $(INSTALL) -m 644 $(1) "$(2).dist"; \
        echo "install: kept $(2); the new one is $(2).dist"; \
    else $(INSTALL) -m 644 $(1) "$(2)"; fi

install: all man
	$(INSTALL) -d "$(DESTDIR)$(LIBEXECDIR)" \
	    "$(DESTDIR)$(APACHE_CONFDIR)/mods-available" "$(DESTDIR)$(LIBDIR)" \
	    "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(MANDIR)/man5" \
	    "$(DESTDIR)$(MANDIR)/man8" "$(DESTDIR)$(DOCDIR)" \
	    "$(DESTDIR)$(TB_CONFDIR)"
	$(INSTALL) -m 644 $(MOD_SO) "$(DESTDIR)$(LIBEXECDIR)/mod_tbucket.so"
	sed 's|^LoadModule tbucket_module .*|LoadModule tbucket_module $(LIBEXECDIR)/mod_tbucket.so|' \
	    conf/tbucket.load > "$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.load"
	chmod 644 "$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.load"
	@$(call install_conf,conf/tbucket.conf,$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.conf)
	$(INSTALL) -m 644 $(SHIM_SO) "$(DESTDIR)$(LIBDIR)/libtbucket_preload.so"
	$(INSTALL) -m 755 $(BUILD)/tbucket "$(DESTDIR)$(BINDIR)/tbucket"
	$(INSTALL) -m 644 $(BUILD)/man/mod_tbucket.5 $(BUILD)/man/tbucket-shim.5 \
	    "$(DESTDIR)$(MANDIR)/man5/"
	$(INSTALL) -m 644 $(BUILD)/man/tbucket.8 "$(DESTDIR)$(MANDIR)/man8/"
	$(INSTALL) -m 644 README.md docs/install.md \
	    $(wildcard conf/tbucket-vhost.conf.example conf/shim.conf) \
	    "$(DESTDIR)$(DOCDIR)/"
	@if [ -f conf/shim.conf ]; then \
	    $(call install_conf,conf/shim.conf,$(DESTDIR)$(TB_CONFDIR)/shim.conf); fi

# Three Apache replicas behind haproxy sharing one Redis, then Redis
# stopped: tools/demo_replicas.py prints allowed/rejected per replica
# against the limit and plots $(BUILD)/demo-replicas.png.
demo-replicas: deps
	$(MAKE) all
	$(PYTHON) tools/demo_replicas.py --build $(abspath $(BUILD))

uninstall:
	@if [ -e "$(DESTDIR)$(APACHE_CONFDIR)/mods-enabled/tbucket.load" ]; then \
	    echo "uninstall: the module is enabled: run a2dismod tbucket first"; \
	    exit 1; fi
	rm -f "$(DESTDIR)$(LIBEXECDIR)/mod_tbucket.so" \
	    "$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.load" \
	    "$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.conf.dist" \
	    "$(DESTDIR)$(LIBDIR)/libtbucket_preload.so" \
	    "$(DESTDIR)$(BINDIR)/tbucket" \
	    "$(DESTDIR)$(MANDIR)/man5/mod_tbucket.5" \
	    "$(DESTDIR)$(MANDIR)/man5/tbucket-shim.5" \
	    "$(DESTDIR)$(MANDIR)/man8/tbucket.8" \
	    "$(DESTDIR)$(TB_CONFDIR)/shim.conf.dist"
	rm -rf "$(DESTDIR)$(DOCDIR)"
ifeq ($(PURGE),1)
	rm -f "$(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.conf" \
	    "$(DESTDIR)$(TB_CONFDIR)/shim.conf"
	-rmdir "$(DESTDIR)$(TB_CONFDIR)" 2>/dev/null
else
	@echo "uninstall: kept $(DESTDIR)$(APACHE_CONFDIR)/mods-available/tbucket.conf and $(DESTDIR)$(TB_CONFDIR)/shim.conf (PURGE=1 removes them)"
endif
