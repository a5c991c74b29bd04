#!/bin/sh
# Install azswap.ko through DKMS, so it is rebuilt for every kernel installed later.
#
#   packaging/dkms-install.sh [-k KERNELVER]... [--version V]   add, build, install
#   packaging/dkms-install.sh --uninstall [--version V]          dkms remove + /usr/src copy
#   packaging/dkms-install.sh --tree DIR [-k KERNELVER]...       build only, all of it under DIR
#
# Copies the module sources (Kbuild, kmod/Kbuild, kmod/*.[ch], kmod/uapi/, kmod/core/Kbuild.inc,
# kmod/core/*.[ch]) and kmod/dkms.conf to /usr/src/azswap-V, then runs `dkms add`, and
# `dkms build` + `dkms install` for each kernel: the -k ones, else every kernel under /lib/modules
# that has its headers (/lib/modules/K/build).  V defaults to the version in pyproject.toml
# (AZSWAP_VERSION overrides it).  Re-running it replaces an earlier add of the same version.
# A copy left by `make install` (/lib/modules/K/updates/azswap.ko) is removed so that modprobe
# finds one module only.  Needs root and the dkms package.
# --tree DIR checks that DKMS builds the module, installing nothing: sources in DIR/src,
# DKMS tree in DIR/dkms (dkms --sourcetree/--dkmstree), `dkms build` only; the module ends up in
# DIR/dkms/azswap/V/KERNELVER/x86_64/module/ (dkms signs it, creating /var/lib/dkms/mok.* if absent).
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
name=azswap

die() { echo "dkms-install: $*" >&2; exit 1; }
usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; exit "${1:-0}"; }

version=${AZSWAP_VERSION:-}
kernels=
uninstall=0
tree=
while [ $# -gt 0 ]; do
	case $1 in
	-k|--kernel) [ $# -ge 2 ] || usage 2; kernels="$kernels $2"; shift 2 ;;
	--version) [ $# -ge 2 ] || usage 2; version=$2; shift 2 ;;
	--uninstall) uninstall=1; shift ;;
	--tree) [ $# -ge 2 ] || usage 2; tree=$2; shift 2 ;;
	-h|--help) usage 0 ;;
	*) echo "dkms-install: unknown argument '$1'" >&2; usage 2 ;;
	esac
done

if [ -z "$version" ]; then
	version=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$top/pyproject.toml" | head -n 1)
	[ -n "$version" ] || die "cannot read the version from pyproject.toml (set AZSWAP_VERSION)"
fi
case $version in
*[!A-Za-z0-9.+~_-]*) die "bad version '$version'" ;;
esac
command -v dkms >/dev/null 2>&1 || die "dkms not found (Debian: apt-get install dkms)"
[ "$(id -u)" = 0 ] || die "needs root"

srcroot=/usr/src
if [ -n "$tree" ]; then
	[ "$uninstall" = 0 ] || die "--tree and --uninstall do not mix"
	mkdir -p "$tree/src" "$tree/dkms"
	tree=$(cd "$tree" && pwd)
	srcroot=$tree/src
fi
src="$srcroot/$name-$version"

# dkms with the trees of --tree, if any
dk() {
	if [ -n "$tree" ]; then
		dkms "$@" --sourcetree "$tree/src" --dkmstree "$tree/dkms"
	else
		dkms "$@"
	fi
}

# Forget any earlier registration of this version (all kernels), keep going if there is none.
forget() {
	if dk status -m "$name" -v "$version" 2>/dev/null | grep -q .; then
		dk remove -m "$name" -v "$version" --all
	fi
}

if [ "$uninstall" = 1 ]; then
	forget
	rm -rf "$src"
	echo "dkms-install: removed $name/$version"
	exit 0
fi

# Kernels to build for.
if [ -z "$kernels" ]; then
	for d in /lib/modules/*/build; do
		[ -e "$d/Makefile" ] || continue
		k=${d%/build}
		kernels="$kernels ${k##*/}"
	done
	[ -n "$kernels" ] || die "no kernel headers under /lib/modules/*/build (Debian: apt-get install linux-headers-\$(uname -r))"
fi

forget
rm -rf "$src"
mkdir -p "$src/kmod/uapi" "$src/kmod/core"
cp "$top/Kbuild" "$src/"
cp "$top/kmod/Kbuild" "$src/kmod/"
for f in "$top"/kmod/*.c "$top"/kmod/*.h; do
	case $f in *.mod.c) continue ;; esac
	cp "$f" "$src/kmod/"
done
cp "$top"/kmod/uapi/*.h "$src/kmod/uapi/"
cp "$top/kmod/core/Kbuild.inc" "$top"/kmod/core/*.c "$top"/kmod/core/*.h "$src/kmod/core/"
sed "s/@PKGVER@/$version/" "$top/kmod/dkms.conf" > "$src/dkms.conf"

dk add -m "$name" -v "$version"
for k in $kernels; do
	[ -e "/lib/modules/$k/build/Makefile" ] || die "no headers for $k (/lib/modules/$k/build)"
	dk build -m "$name" -v "$version" -k "$k"
	[ -z "$tree" ] || continue
	dkms install -m "$name" -v "$version" -k "$k"
	if [ -e "/lib/modules/$k/updates/$name.ko" ]; then
		echo "dkms-install: removing the 'make install' copy /lib/modules/$k/updates/$name.ko"
		rm -f "/lib/modules/$k/updates/$name.ko"
		depmod -a "$k"
	fi
done
dk status -m "$name" -v "$version"
