#!/bin/sh
# embed-lua.sh -- turn the Lua scripts in shared/ into a C file holding each
# script's text and SHA-1, so the library reads no file at run time and
# knows every EVALSHA digest without asking Redis.
#
#   embed-lua.sh shared/tb_bucket.lua [more.lua ...]
#
# The first script is the token bucket: tb_script_source / tb_script_sha1,
# as before. Every script, the first included, goes into a table indexed by
# tb_algo_t in the order given (the Makefile passes them in enum order), read
# through tb_algo_script_source() / tb_algo_script_sha1().
set -e
[ $# -ge 1 ] || { echo "usage: $0 tb_bucket.lua [more.lua ...]" >&2; exit 2; }

emit_text() {
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$1"
    echo ';'
}

echo "/* Generated from $* by scripts/embed-lua.sh. */"
echo '#include <stddef.h>'
echo '#include "tb_algo_int.h"'
first="$1"
echo "const char tb_script_sha1[41] = \"$(sha1sum "$first" | cut -d' ' -f1)\";"
echo 'const char tb_script_source[] ='
emit_text "$first"
i=0
shift
for lua in "$@"; do
    i=$((i + 1))
    echo "static const char sha_$i[41] = \"$(sha1sum "$lua" | cut -d' ' -f1)\";"
    echo "static const char src_$i[] ="
    emit_text "$lua"
done
count=$((i + 1))
echo "static const char *const sources[$count] = { tb_script_source"
j=1; while [ $j -le $i ]; do echo "    , src_$j"; j=$((j + 1)); done
echo '};'
echo "static const char *const digests[$count] = { tb_script_sha1"
j=1; while [ $j -le $i ]; do echo "    , sha_$j"; j=$((j + 1)); done
echo '};'
cat <<EOC
const char *tb_algo_script_source(tb_algo_t a)
{
    return (unsigned)a < $count && (unsigned)a < TB_ALGO_COUNT
           ? sources[a] : NULL;
}

const char *tb_algo_script_sha1(tb_algo_t a)
{
    return (unsigned)a < $count && (unsigned)a < TB_ALGO_COUNT
           ? digests[a] : NULL;
}
EOC
