# fetch-lib.sh -- what scripts/fetch-php.sh and scripts/fetch-qos.sh share:
# DIR locked against a second fetch, a scratch directory apt may write
# into, the downloaded packages unpacked with `dpkg -x` and checked, and
# the result put in DIR/root with its version in DIR/VERSION.
#
# Sourced, not run: the caller sets ME (its name, the prefix of every
# message) and DIR, and runs under `set -eu`. What each script downloads
# and how it decides that DIR is up to date stay in the script.
# shellcheck shell=sh

# fetch_lock: DIR made and turned absolute, then held: one fetch at a
# time (two test or bench runs may start together). The lock is fd 9,
# released when the script exits.
fetch_lock() {
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    exec 9>"$DIR/.lock"
    flock 9
}

# fetch_scratch: $tmp, a directory in DIR removed when the script exits.
fetch_scratch() {
    tmp=$(mktemp -d "$DIR/.fetch.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    chmod 755 "$tmp"
    # apt downloads as _apt when that user may write the directory.
    chown _apt "$tmp" 2>/dev/null || true
}

# fetch_unpack PKGS FILE...: every .deb in $tmp unpacked into $tmp/root;
# exits 1, naming it and PKGS, when a FILE (a path under root) is not
# there.
fetch_unpack() {
    pkgs=$1
    shift
    rm -rf "$tmp/root"
    for deb in "$tmp"/*.deb; do
        dpkg -x "$deb" "$tmp/root"
    done
    for f in "$@"; do
        if [ ! -e "$tmp/root/$f" ]; then
            echo "$ME: $f is not in $pkgs" >&2
            exit 1
        fi
    done
}

# fetch_install VERSION: $tmp/root becomes DIR/root, readable by all (the
# servers that load from it run as www-data), and VERSION is recorded.
fetch_install() {
    rm -rf "$DIR/root"
    mv "$tmp/root" "$DIR/root"
    chmod 755 "$DIR" "$DIR/root"
    printf '%s\n' "$1" > "$DIR/VERSION"
}
