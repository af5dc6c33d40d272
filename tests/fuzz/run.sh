#!/bin/sh
# run.sh -- `make fuzz`: build the libFuzzer targets and run each for a
# bounded time.
#
#   sh tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET] [TARGET...]
#
# Targets (tests/fuzz/fuzz_<name>.c): url, key, parse, call, shimconf (when
# shim/shim_conf.c exists), rmcall (redismod/rm_command.c, the Redis
# module's command parser), form (mod_tbucket/tbucket_form_parse.c, the
# module's reader of login forms) and any target added later. Each is
# built with clang -fsanitize=fuzzer,address,undefined over the core
# sources, seeded from tests/fuzz/corpus/<name>/ (kept in git: seeds and
# every regression input), and grows a scratch corpus under
# BUILD_DIR/fuzz/corpus/<name>/. A crash or failed invariant leaves its
# input in BUILD_DIR/fuzz/artifacts/<name>/ and makes the run fail: copy
# it into tests/fuzz/corpus/<name>/ so hostile/test_fuzz_regress.py
# replays it.
set -eu
BUILD=${1:-build}
SECS=${2:-25}
[ $# -ge 2 ] && shift 2 || shift $#
TARGETS=${*:-"url key parse call shimconf rmcall form"}
CLANG=${CLANG:-clang}
FUZZ=$BUILD/fuzz
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all"
LSAN_OPTIONS=suppressions=$(pwd)/tests/fuzz/lsan.supp:print_suppressions=0
export LSAN_OPTIONS

command -v "$CLANG" >/dev/null || {
    echo "fuzz: $CLANG is missing: apt-get install clang libclang-rt-14-dev" >&2
    exit 1
}
mkdir -p "$FUZZ"
SCRIPT_C=$BUILD/shared/algo/tb_script.c
[ -f "$SCRIPT_C" ] || {
    echo "fuzz: $SCRIPT_C missing: run make first" >&2
    exit 1
}
CFLAGS="-g -O1 -fno-omit-frame-pointer -D_GNU_SOURCE -Ishared -Ishim -I$BUILD"
# The core in its layers (shared/README.md): the decision path and the
# folders below it.
CORE="shared/*.c shared/*/*.c $SCRIPT_C"

build() { # name extra-sources extra-libs
    echo "fuzz: building $FUZZ/fuzz_$1"
    # shellcheck disable=SC2086
    $CLANG $CFLAGS -fsanitize=fuzzer $SAN -o "$FUZZ/fuzz_$1" \
        tests/fuzz/fuzz_$1.c $2 $CORE -lhiredis -lssl -lcrypto -lm -pthread $3
}

# Known, reported bugs (tests/fuzz/KNOWN_OPEN): skip their checks here.
FUZZ_SKIP_KNOWN=$(grep -v '^#' tests/fuzz/KNOWN_OPEN 2>/dev/null \
    | awk 'NF {printf "%s%s", sep, $1; sep = ","}')
export FUZZ_SKIP_KNOWN
echo "fuzz: skipping known open bugs: ${FUZZ_SKIP_KNOWN:-none}"

fail=0
for t in $TARGETS; do
    case $t in
    shimconf)
        [ -f shim/shim_conf.c ] || { echo "fuzz: no shim/shim_conf.c"; continue; }
        # The shim's config loader: its files as the Makefile's SHIMCONF.
        build shimconf "shim/shim_conf.c shim/shim_conf_table.c" \
            "-lconfig -ldl" ;;
    rmcall)
        # tbucket_redis.so's parser and decision, without Redis.
        build rmcall "redismod/rm_command.c -Iredismod" "" ;;
    form)
        # The module's form reader (%{FORM:field}), without Apache.
        build form "mod_tbucket/tbucket_form_parse.c -Imod_tbucket" "" ;;
    *)
        build "$t" "" "" ;;
    esac
    mkdir -p "$FUZZ/corpus/$t" "$FUZZ/artifacts/$t"
    dict=""
    [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
    extra=""
    # libconfig leaks on many syntax errors; a leak check after each such
    # input costs a full LSan scan, so the replay test checks leaks instead.
    [ "$t" = shimconf ] && extra="-detect_leaks=0"
    echo "fuzz: running $t for ${SECS}s"
    # shellcheck disable=SC2086
    if ! "$FUZZ/fuzz_$t" -max_total_time="$SECS" -timeout=10 \
            -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
            -artifact_prefix="$FUZZ/artifacts/$t/" $dict $extra \
            "$FUZZ/corpus/$t" "tests/fuzz/corpus/$t" \
            >"$FUZZ/$t.log" 2>&1; then
        echo "fuzz: $t FAILED: see $FUZZ/$t.log and $FUZZ/artifacts/$t/" >&2
        tail -40 "$FUZZ/$t.log" >&2
        fail=1
    fi
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)|cov: ' \
        "$FUZZ/$t.log" | tail -3
done
exit $fail
