#!/bin/sh
# apache2.sh -- run apache2 with what one build of mod_tbucket needs; the
# one way the integration tests, `make run` and `make demo-replicas` start
# Apache (also for `apache2 -t` checks).
#
#   scripts/apache2.sh MODULE_SO [apache2 arguments...]
#
# MODULE_SO is the mod_tbucket.so the configuration loads. A sanitizer build
# of it (make SANITIZER=address,undefined) links libasan, whose runtime must
# come first in the initial library list, and apache2 is not built with it:
# the runtimes the module links (libasan, libubsan) are preloaded into
# apache2, and only there, since curl hangs in setlocale and python fails
# with libasan preloaded. Leak checking is off: Apache leaves its pools to
# the exit. Any other build runs apache2 with LD_PRELOAD removed, so a
# preload meant for the caller (the shim) never reaches Apache by accident.
# TB_APACHE_PRELOAD names libraries to preload into apache2 on purpose
# (the shim tests run Apache under the shim), after the runtimes.
#
# The script execs apache2, so the PID its caller sees is Apache's.
set -eu

APACHE=/usr/sbin/apache2
so=${1:?usage: scripts/apache2.sh MODULE_SO [apache2 arguments...]}
shift

# The runtimes as the dynamic linker resolves them for this module, asked
# without the caller's preload (ldd would list a preloaded one by path).
san=$(LD_PRELOAD= ldd "$so" 2>/dev/null \
      | awk '$1 ~ /^lib(asan|ubsan)\.so/ && $3 ~ /^\// { printf "%s ", $3 }')
case $san in
*libasan*)
    ASAN_OPTIONS=detect_leaks=0
    UBSAN_OPTIONS=print_stacktrace=1
    export ASAN_OPTIONS UBSAN_OPTIONS
    ;;
*)
    san=
    ;;
esac
preload="$san${TB_APACHE_PRELOAD:-}"
if [ -n "${preload% }" ]; then
    LD_PRELOAD=${preload% }
    export LD_PRELOAD
else
    unset LD_PRELOAD
fi
exec "$APACHE" "$@"
