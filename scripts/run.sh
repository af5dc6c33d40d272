#!/bin/sh
# run.sh -- the `make run` demo: its own redis-server and apache2 in the
# foreground on 127.0.0.1:8080, protecting the PHP app and CGI script of
# conf/demo/ with mod_tbucket.
#
#   sh scripts/run.sh BUILD_DIR      (make run does this after building)
#
# Everything lives in a fresh temp dir (config, docroot, logs, Redis data)
# generated from conf/demo/httpd.conf.in; nothing under /etc is used or
# changed. Ctrl-C stops Apache and Redis by PID and removes the temp dir.
# TB_DEMO_PORT and TB_DEMO_REDIS_PORT override the ports.
set -eu

BUILD=${1:?usage: sh scripts/run.sh BUILD_DIR}
TOP=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
PORT=${TB_DEMO_PORT:-8080}
MODDIR=/usr/lib/apache2/modules
APACHE=/usr/sbin/apache2

for f in "$BUILD/mod_tbucket.so" "$APACHE" /usr/bin/redis-server \
         /usr/bin/redis-cli /usr/bin/php-cgi; do
    if [ ! -e "$f" ]; then
        echo "run.sh: $f is missing (make deps && make)" >&2
        exit 1
    fi
done

free_port() {
    python3 -c 'import socket; s = socket.socket(); \
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
REDIS_PORT=${TB_DEMO_REDIS_PORT:-$(free_port)}

# /tmp, mode 0755: Apache's children run as www-data and must reach the
# docroot and the scripts.
ROOT=$(mktemp -d /tmp/tbucket-demo.XXXXXX)
chmod 755 "$ROOT"
REDIS_PID=
APACHE_PID=

cleanup() {
    trap - INT TERM EXIT
    if [ -n "$APACHE_PID" ] && kill -0 "$APACHE_PID" 2>/dev/null; then
        kill -TERM "$APACHE_PID" 2>/dev/null || true
        i=0
        while kill -0 "$APACHE_PID" 2>/dev/null && [ $i -lt 100 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        kill -KILL "$APACHE_PID" 2>/dev/null || true
    fi
    if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
        kill -TERM "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
    fi
    rm -rf "$ROOT"
    echo "run.sh: stopped Apache and Redis"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$ROOT/run" "$ROOT/logs" "$ROOT/redis" "$ROOT/php-bin"
cp -R "$TOP/conf/demo/htdocs" "$TOP/conf/demo/cgi-bin" "$ROOT/"
printf '#!/bin/sh\nexec /usr/bin/php-cgi\n' > "$ROOT/php-bin/php-cgi"
chmod 755 "$ROOT/php-bin/php-cgi" "$ROOT/cgi-bin/hello.cgi"
chmod -R a+rX "$ROOT/htdocs" "$ROOT/cgi-bin" "$ROOT/php-bin"

sed -e "s|@ROOT@|$ROOT|g" -e "s|@PORT@|$PORT|g" -e "s|@MODDIR@|$MODDIR|g" \
    -e "s|@MODULE@|$BUILD/mod_tbucket.so|g" \
    -e "s|@REDIS_URL@|redis://127.0.0.1:$REDIS_PORT|g" \
    "$TOP/conf/demo/httpd.conf.in" > "$ROOT/httpd.conf"

# apache2.sh preloads a sanitizer build's runtimes (make
# SANITIZER=address,undefined) into apache2, and only there.
APACHE2_SH="$TOP/scripts/apache2.sh"
"$APACHE2_SH" "$BUILD/mod_tbucket.so" -t -f "$ROOT/httpd.conf"

/usr/bin/redis-server --bind 127.0.0.1 --port "$REDIS_PORT" \
    --dir "$ROOT/redis" --save '' --appendonly no --daemonize no \
    --logfile "$ROOT/logs/redis.log" &
REDIS_PID=$!
i=0
until /usr/bin/redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "run.sh: redis-server did not start (see $ROOT/logs)" >&2
        exit 1
    fi
    sleep 0.1
done

# setsid: on shutdown Apache signals its whole process group, which must
# not be ours. apache2.sh execs apache2, so $! is Apache's PID.
setsid "$APACHE2_SH" "$BUILD/mod_tbucket.so" -f "$ROOT/httpd.conf" \
    -DFOREGROUND &
APACHE_PID=$!
i=0
until /usr/bin/curl -s -o /dev/null "http://127.0.0.1:$PORT/"; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$APACHE_PID" 2>/dev/null; then
        echo "run.sh: apache2 did not start:" >&2
        tail -20 "$ROOT/logs/error.log" >&2 || true
        exit 1
    fi
    sleep 0.1
done

U="http://127.0.0.1:$PORT"
cat <<EOF

mod_tbucket demo: Apache on $U (pid $APACHE_PID), Redis on 127.0.0.1:$REDIS_PORT (pid $REDIS_PID)
Logs: $ROOT/logs/error.log and access.log

Limits: 20 requests of burst per X-API-Key (per IP without one), 2/s refill;
/app/export.php costs 10 and has an "export" bucket (30 tokens, 30/m);
tenant "gold-key" gets 100 at 10/s. If Redis stops, each server decides
locally (TBucketFailurePolicy local).

Try:
  curl -i -H 'X-API-Key: alice' $U/app/
  curl -i -H 'X-API-Key: alice' $U/cgi-bin/hello.cgi
  curl -i -H 'X-API-Key: alice' $U/app/export.php
  for i in \$(seq 1 25); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-API-Key: bob' $U/app/; done; echo
  for i in \$(seq 1 25); do curl -s -o /dev/null -w '%{http_code} ' -H 'X-API-Key: gold-key' $U/app/; done; echo
  curl -s $U/tbucket-status | grep -v '^#'
  redis-cli -p $REDIS_PORT hgetall 'demo:{bob}'
  redis-cli -p $REDIS_PORT shutdown nosave   # then watch the local policy answer

Ctrl-C stops everything.
EOF

# Wait for Apache; Ctrl-C runs cleanup through the traps above.
wait "$APACHE_PID" || true
