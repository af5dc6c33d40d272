#!/bin/sh
# install-deps.sh -- install the Debian 12 packages the build, the tests and
# `make run` need, and say which ones it installs; arguments name extra
# packages for a target that needs more (make fuzz). Run by `make test`,
# `make run`, `make deb` and .ci/run; a machine that has them all is left
# untouched.
set -e
PKGS="build-essential pkg-config apache2 apache2-dev libhiredis-dev \
libssl-dev openssl ca-certificates libconfig-dev redis-server redis-tools \
php-cgi haproxy wrk curl python3 python3-pytest python3-redis \
python3-requests python3-yaml python3-matplotlib libcmocka-dev \
docker-compose groff-base chromium prometheus debhelper dpkg-dev lintian postgresql \
php-cli php-pgsql nginx strace locales fail2ban tmux"
# mod_php and php-fpm for the real PHP stacks, which scripts/fetch-php.sh
# unpacks without installing: the PHP they match, and the libraries
# `ldd libphp8.2.so php-fpm8.2` names beyond libc and OpenSSL.
PKGS="$PKGS php8.2-common php8.2-cli php8.2-opcache libxml2 libpcre2-8-0 \
zlib1g libsodium23 libargon2-1 libicu72 liblzma5 libstdc++6 libmagic1 \
libapparmor1 libacl1 libsystemd0 libcap2 libgcrypt20 libzstd1 liblz4-1"
# The WordPress rig of the tests (tests/integration/tbtest/wordpress.py):
# Debian's WordPress on a MariaDB of the test's own, through PHP's mysqli.
# wordpress depends on "libapache2-mod-php | php": naming php, which
# php-cgi satisfies, keeps apt from picking mod_php, whose postinst
# switches the system's Apache to prefork (the rig unpacks its own, as
# scripts/fetch-php.sh does).
PKGS="$PKGS php wordpress mariadb-server php8.2-mysql"
# Extra packages for one target (make fuzz: clang libclang-rt-14-dev).
PKGS="$PKGS $*"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null \
            | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    echo "deps: all packages present"
    exit 0
fi
echo "deps: installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
# Debian starts the services it installs; the tests run their own on free
# loopback ports, so the stock ones are not needed (and are harmless).
