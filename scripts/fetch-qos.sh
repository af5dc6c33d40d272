#!/bin/sh
# fetch-qos.sh -- unpack mod_qos for the overload bench, without
# installing it.
#
#   scripts/fetch-qos.sh [DIR]        (default $TB_QOS_DIR, else
#                                      /var/cache/tbucket-qos)
#
# bench/overload.py compares local protection with mod_qos, the Apache
# module that limits requests per location and closes keep-alive under
# load. `apt-get install libapache2-mod-qos` would run its postinst, which
# enables the module in the system's Apache: instead Debian's package is
# fetched with `apt-get download` and unpacked with `dpkg -x` into
# DIR/root, where the bench loads DIR/root/usr/lib/apache2/modules/
# mod_qos.so from its own configuration; its manual is
# DIR/root/usr/share/doc/libapache2-mod-qos/index.html. Debian's mod_qos
# 11.63 calls PCRE 1 (pcre_compile, pcre_free) without naming libpcre3
# as a library it needs, and Debian 12's apache2 links PCRE 2 only, so
# libpcre3 is unpacked beside it and the bench loads it first (LoadFile
# DIR/root/lib/x86_64-linux-gnu/libpcre.so.3): nothing is installed.
# DIR/VERSION records the version of mod_qos unpacked: a second run finds
# it and does nothing. Run by bench/overload.py when DIR is missing, as
# fetch-php.sh is.
set -eu
# shellcheck source=scripts/fetch-lib.sh
. "$(dirname "$0")/fetch-lib.sh"

ME=fetch-qos
DIR=${1:-${TB_QOS_DIR:-/var/cache/tbucket-qos}}
PKG=libapache2-mod-qos
PKGS="$PKG libpcre3"
SO=usr/lib/apache2/modules/mod_qos.so
PCRE=lib/x86_64-linux-gnu/libpcre.so.3

fetch_lock

if [ -f "$DIR/root/$SO" ] && [ -e "$DIR/root/$PCRE" ] \
        && [ -s "$DIR/VERSION" ]; then
    echo "fetch-qos: $DIR has $PKG $(cat "$DIR/VERSION")"
    exit 0
fi

fetch_scratch

echo "fetch-qos: apt-get download $PKGS into $DIR"
# shellcheck disable=SC2086
if ! (cd "$tmp" && { apt-get download -q $PKGS >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 || true;
             apt-get download -q $PKGS; }; }); then
    echo "fetch-qos: apt-get download $PKGS failed" >&2
    exit 1
fi
fetch_unpack "$PKGS" "$SO" "$PCRE"
deb=$(ls "$tmp"/${PKG}_*.deb)
got=$(dpkg-deb -f "$deb" Version)
fetch_install "$got"
echo "fetch-qos: unpacked $PKG $got into $DIR/root"
