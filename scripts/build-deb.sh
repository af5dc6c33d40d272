#!/bin/sh
# build-deb.sh -- `make deb`: the Debian binary packages, built with
# dpkg-buildpackage from a copy of the tracked tree under OUT.
#
#   sh scripts/build-deb.sh OUT        (make deb passes $(BUILD)/deb)
#
# dpkg-buildpackage writes its results into the parent of the source
# directory, so the build runs in OUT/src/mod-tbucket-VERSION and never in
# the work tree. The copy holds the tracked files as they are in the work
# tree: build outputs and other untracked files stay behind, so the result
# is the same in a fresh clone. The .deb, .changes and .buildinfo files
# end up in OUT.
#
# VERSION is the one place the version is set; the top entry of
# debian/changelog must carry it as its upstream part (VERSION-N), and
# the build stops if it does not.
set -e

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-deb.sh OUTDIR}
jobs=${DEB_JOBS:-2}

version=$(cat "$root/VERSION")
case "$version" in
    [0-9]*) ;;
    *) echo "deb: VERSION holds '$version', not a version" >&2; exit 1 ;;
esac
deb_version=$(dpkg-parsechangelog -l "$root/debian/changelog" -S Version)
if [ "${deb_version%-*}" != "$version" ]; then
    echo "deb: debian/changelog is at $deb_version but VERSION says" \
         "$version: add a changelog entry (dch -v $version-1)" >&2
    exit 1
fi

if ! git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "deb: $root is not a git work tree: the package is built from" \
         "its tracked files" >&2
    exit 1
fi

src="$out/src/mod-tbucket-$version"
rm -rf "$out"
mkdir -p "$src"
git -C "$root" ls-files -z \
    | tar -C "$root" --null -T - -cf - \
    | tar -C "$src" -xf -

# A make above us (make deb) passes its variables and jobserver through
# the environment (SANITIZER too, under make asan); the package build
# takes only what debian/rules sets.
cd "$src"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u MAKEOVERRIDES -u BUILD \
    -u SANITIZER \
    dpkg-buildpackage -us -uc -b -j"$jobs"

mv "$out"/src/*.deb "$out"/src/*.changes "$out"/src/*.buildinfo "$out"/
echo "deb: built in $out:"
ls -1 "$out"/*.deb
