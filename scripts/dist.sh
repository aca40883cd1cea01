#!/bin/sh
# dist.sh URL [HOMEPAGE]: a release tarball of the committed tree
# (build/cumulo-VERSION.tar.gz, from git archive) and the Homebrew formula
# for it (build/cumulo.rb: packaging/homebrew/cumulo.rb.in with URL, the
# tarball's sha256 and the version filled in). URL is where the tarball will
# be published; the formula is only right once it is there.
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh scripts/dist.sh URL-OF-THE-TARBALL [HOMEPAGE]" >&2; exit 2; }
url=$1
home=${2:-$(dirname "$url")}
version=$(sed -n 's/^#define CM_VERSION "\(.*\)"/\1/p' src/base/base.h)
mkdir -p build
tgz=build/cumulo-$version.tar.gz
git archive --format=tar.gz --prefix="cumulo-$version/" -o "$tgz" HEAD
sha=$(sha256sum "$tgz" 2>/dev/null | cut -d' ' -f1 || shasum -a 256 "$tgz" | cut -d' ' -f1)
sed -e "s|@URL@|$url|" -e "s|@SHA256@|$sha|" -e "s|@VERSION@|$version|" -e "s|@HOMEPAGE@|$home|" \
    packaging/homebrew/cumulo.rb.in >build/cumulo.rb
echo "$tgz (sha256 $sha)"
echo "build/cumulo.rb"
