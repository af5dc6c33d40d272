#!/bin/sh
# fetch-php.sh -- unpack mod_php and php-fpm for the tests and the bench,
# without installing either.
#
#   scripts/fetch-php.sh [DIR]        (default $TB_PHP_DIR, else
#                                      /var/cache/tbucket-php)
#
# `apt-get install libapache2-mod-php8.2` would switch the system's Apache
# to the prefork MPM in its postinst, and php8.2-fpm would start a service:
# instead both packages are fetched with `apt-get download` and unpacked
# with `dpkg -x` into DIR/root, where tests/integration/tbtest/php.py finds
# DIR/root/usr/lib/apache2/modules/libphp8.2.so and
# DIR/root/usr/sbin/php-fpm8.2. The version is the one of the PHP the
# machine has (php8.2-common, installed by scripts/install-deps.sh), so
# the unpacked SAPIs match its extensions (the archive may have moved on:
# then the current version, which runs the same without them); the
# libraries they link are in install-deps.sh too. DIR/VERSION records the
# version asked for: a second run for the same one does nothing. Run by
# `make integration`; the tests and bench/overload.py run it too when
# DIR is missing.
set -eu
# shellcheck source=scripts/fetch-lib.sh
. "$(dirname "$0")/fetch-lib.sh"

ME=fetch-php
DIR=${1:-${TB_PHP_DIR:-/var/cache/tbucket-php}}
PKGS="libapache2-mod-php8.2 php8.2-fpm"
MOD_PHP=usr/lib/apache2/modules/libphp8.2.so
FPM=usr/sbin/php-fpm8.2

fetch_lock

ver=$(dpkg-query -W -f='${Version}' php8.2-common 2>/dev/null || true)
if [ -n "$ver" ] && [ "$(cat "$DIR/VERSION" 2>/dev/null)" = "$ver" ] \
        && [ -f "$DIR/root/$MOD_PHP" ] && [ -x "$DIR/root/$FPM" ]; then
    echo "fetch-php: $DIR has PHP $ver"
    exit 0
fi

fetch_scratch

# download PKG...: the packages at $ver, with a fresh package list if
# the first try fails, else at the candidate version.
download() {
    (
        cd "$tmp"
        pinned=$(for p in "$@"; do printf '%s=%s ' "$p" "$ver"; done)
        if [ -n "$ver" ]; then
            # shellcheck disable=SC2086
            apt-get download -q $pinned >/dev/null 2>&1 && exit 0
        fi
        apt-get update -q >/dev/null 2>&1 || true
        if [ -n "$ver" ]; then
            # shellcheck disable=SC2086
            apt-get download -q $pinned >/dev/null 2>&1 && exit 0
            echo "fetch-php: $ver is not in the archive: the candidate" >&2
        fi
        apt-get download -q "$@"
    )
}

echo "fetch-php: apt-get download $PKGS (${ver:-candidate}) into $DIR"
# shellcheck disable=SC2086
if ! download $PKGS; then
    echo "fetch-php: apt-get download $PKGS failed" >&2
    exit 1
fi
fetch_unpack "$PKGS" "$MOD_PHP" "$FPM"
got=$(dpkg-deb -f "$(ls "$tmp"/php8.2-fpm_*.deb)" Version)
fetch_install "${ver:-$got}"
echo "fetch-php: unpacked PHP $got into $DIR/root"
