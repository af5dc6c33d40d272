#!/bin/sh
# embed-lua.sh -- turn shared/tb_bucket.lua into a C file holding the script
# text and its SHA-1, so the library reads no file at run time and knows
# the EVALSHA digest without asking Redis.
set -e
lua="$1"
sha=$(sha1sum "$lua" | cut -d' ' -f1)
echo '/* Generated from shared/tb_bucket.lua by scripts/embed-lua.sh. */'
echo '#include "tb.h"'
echo "const char tb_script_sha1[41] = \"$sha\";"
echo 'const char tb_script_source[] ='
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$lua"
echo ';'
