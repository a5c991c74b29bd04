#!/bin/bash
# The kernel series azswap supports, from Debian's archive (idempotent, cached).
#
#   scripts/kernels.sh install [SERIES...]  install 6.12 and/or 7.3 (default: both)
#   scripts/kernels.sh release SERIES       print the kernel release (e.g. 6.12.95+deb12-amd64)
#   scripts/kernels.sh image SERIES         print the path of its vmlinuz
#   scripts/kernels.sh build SERIES [debug] build the module for it: build/kmod-SERIES/azswap.ko
#                                           (debug: the self-test build, build/kmod-SERIES-debug)
#   scripts/kernels.sh dkms SERIES DIR      DKMS add + build for it, nothing installed
#                                           (packaging/dkms-install.sh --tree DIR; 7.3: in the
#                                           chroot, with DIR's tree in it and the module copied
#                                           back to DIR/azswap.ko)
#
# SERIES is 6.1, 6.12 or 7.3.
#   6.1   Debian 12's kernel (linux-image-amd64; scripts/setup.sh installs it).
#   6.12  bookworm-backports, installed with apt-get (its own sources file); the versioned
#         package names are resolved from the suite's metapackage, which is never installed
#         (the default kernel stays 6.1).
#   7.3   trixie-backports.  Its kbuild needs Debian 13's libc, so a debootstrap trixie chroot
#         (cached) holds the headers and builds the module; the image and modules are unpacked
#         with dpkg -x beside it.  Nothing is installed on the host for it.
# Cache: $AZSWAP_CACHE (default ~/.cache/azswap)/kernels.  AZSWAP_KERNELS_UPDATE=1 looks for
# a newer backports kernel even when one is installed.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cache="${AZSWAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/azswap}/kernels"
mirror=http://deb.debian.org/debian
bpo_list=/etc/apt/sources.list.d/azswap-bookworm-backports.list
root73="$cache/trixie-root"
dir73="$cache/7.3"

say() { echo "kernels: $*" >&2; }
die() { echo "kernels: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "need root to $1"; }

# --- 6.12 ------------------------------------------------------------------------------------
installed_612() {
	local d rel
	for d in $(find /lib/modules -mindepth 1 -maxdepth 1 -name '6.12.*' -printf '%f\n' \
		2>/dev/null | sort -rV); do
		rel=$d
		[ -e "/boot/vmlinuz-$rel" ] && [ -e "/lib/modules/$rel/build/Makefile" ] &&
			[ -e "/lib/modules/$rel/modules.dep" ] && { echo "$rel"; return 0; }
	done
	return 1
}

install_612() {
	local rel pkgs
	if rel=$(installed_612) && [ -z "${AZSWAP_KERNELS_UPDATE:-}" ]; then
		say "6.12: $rel installed"
		return 0
	fi
	need_root "install 6.12"
	export DEBIAN_FRONTEND=noninteractive
	if [ ! -e "$bpo_list" ] || ! apt-cache policy | grep -q 'bookworm-backports'; then
		say "6.12: adding bookworm-backports ($bpo_list)"
		echo "deb $mirror bookworm-backports main" >"$bpo_list"
		apt-get update -q
	fi
	rel=$(apt-cache -t bookworm-backports depends linux-image-amd64 |
		sed -n 's/^ *Depends: linux-image-\(6\.12\.[^ ]*\)$/\1/p' | head -n 1)
	[ -n "$rel" ] || die "6.12: no linux-image-6.12.* in bookworm-backports"
	# The versioned packages only: the backports metapackages would move the default kernel.
	pkgs="linux-image-$rel linux-headers-$rel"
	say "6.12: installing $pkgs"
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $pkgs
	[ "$("$top/scripts/kver")" != "$rel" ] || die "6.12: the default kernel moved to $rel"
	installed_612 >/dev/null || die "6.12: $rel did not install completely"
}

# --- 7.3 -------------------------------------------------------------------------------------
in_root() { chroot "$root73" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
	DEBIAN_FRONTEND=noninteractive "$@"; }

release_73() { cat "$dir73/release" 2>/dev/null; }

install_73() {
	local rel tmp deb
	if rel=$(release_73) && [ -e "$dir73/boot/vmlinuz-$rel" ] &&
		[ -e "$dir73/lib/modules/$rel/modules.dep" ] &&
		[ -e "$root73/usr/src/linux-headers-$rel/Makefile" ] &&
		[ -x "$root73/usr/sbin/dkms" ] &&
		[ -z "${AZSWAP_KERNELS_UPDATE:-}" ]; then
		say "7.3: $rel cached in $dir73"
		return 0
	fi
	need_root "install 7.3 (debootstrap, chroot)"
	mkdir -p "$cache"
	if [ ! -e "$root73/.azswap-ok" ]; then
		command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap
		say "7.3: debootstrap trixie into $root73 (a few minutes)"
		rm -rf "$root73.tmp"
		debootstrap --variant=minbase --include=ca-certificates trixie "$root73.tmp" "$mirror" >&2
		echo "deb $mirror trixie-backports main" >"$root73.tmp/etc/apt/sources.list.d/backports.list"
		rm -rf "$root73"
		mv "$root73.tmp" "$root73"
		touch "$root73/.azswap-ok"
	fi
	say "7.3: resolving the kernel in trixie-backports"
	in_root apt-get update -q >&2
	rel=$(in_root apt-cache -t trixie-backports depends linux-image-amd64 |
		sed -n 's/^ *Depends: linux-image-\(7\.3\.[^ ]*\)$/\1/p' | head -n 1)
	[ -n "$rel" ] || die "7.3: no linux-image-7.3.* in trixie-backports"
	say "7.3: headers and kbuild for $rel in the chroot"
	in_root apt-get install -y -q --no-install-recommends "linux-headers-$rel" make binutils \
		pahole kmod dkms openssl >&2
	say "7.3: unpacking the image and modules of $rel into $dir73"
	tmp="$root73/tmp/azswap-debs"
	rm -rf "$tmp" "$dir73.tmp"
	mkdir -p "$tmp" "$dir73.tmp"
	# The image package is split: the kernel binary, its modules and their base files.
	(cd "$tmp" && in_root sh -c "cd /tmp/azswap-debs && apt-get download -q \
		linux-image-$rel \$(apt-cache depends linux-image-$rel |
		sed -n 's/^ *Depends: \(linux-[a-z]*-$rel\)\$/\1/p')") >&2
	for deb in "$tmp"/*.deb; do
		dpkg -x "$deb" "$dir73.tmp"
	done
	rm -rf "$tmp"
	if [ ! -e "$dir73.tmp/boot/vmlinuz-$rel" ] && [ -e "$dir73.tmp/usr/lib/modules/$rel/vmlinuz" ]; then
		mkdir -p "$dir73.tmp/boot"
		cp "$dir73.tmp/usr/lib/modules/$rel/vmlinuz" "$dir73.tmp/boot/vmlinuz-$rel"
	fi
	[ -e "$dir73.tmp/boot/vmlinuz-$rel" ] || die "7.3: no vmlinuz-$rel in the image packages"
	if [ -d "$dir73.tmp/usr/lib/modules" ] && [ ! -e "$dir73.tmp/lib/modules" ]; then
		mkdir -p "$dir73.tmp/lib"
		mv "$dir73.tmp/usr/lib/modules" "$dir73.tmp/lib/modules"
	fi
	# The headers live in the chroot: point build/source there (bcc in a guest reads them).
	ln -sfn "$root73/usr/src/linux-headers-$rel" "$dir73.tmp/lib/modules/$rel/build"
	ln -sfn "$root73/usr/src/linux-headers-${rel%-amd64}-common" "$dir73.tmp/lib/modules/$rel/source"
	depmod -b "$dir73.tmp" "$rel"
	echo "$rel" >"$dir73.tmp/release"
	rm -rf "$dir73"
	mv "$dir73.tmp" "$dir73"
	say "7.3: $rel ready"
}

# --- queries ---------------------------------------------------------------------------------
release() {
	case "$1" in
	6.1) "$top/scripts/kver" ;;
	6.12) installed_612 || die "6.12 is not installed: run 'make setup'" ;;
	7.3) release_73 || die "7.3 is not installed: run 'make setup'" ;;
	*) die "unknown series '$1' (6.1, 6.12 or 7.3)" ;;
	esac
}

image() {
	local rel
	rel=$(release "$1")
	case "$1" in
	7.3) echo "$dir73/boot/vmlinuz-$rel" ;;
	*) echo "/boot/vmlinuz-$rel" ;;
	esac
}

# Copy the module's sources (not its objects) into $1, keeping times so kbuild rebuilds
# only what changed.
copy_sources() {
	local dst=$1
	mkdir -p "$dst"
	(cd "$top" && find Kbuild kmod \( -name '*.[ch]' -o -name 'Kbuild*' -o -name '*.inc' \) \
		-not -path 'kmod/core/host/*' -not -path 'kmod/core/fuzz/*' \
		-not -name '*.mod.c' -print0 | cpio -0 -pdmu --quiet "$dst")
}

# build SERIES [debug]: the module for SERIES in build/kmod-SERIES (debug: the self-test
# build, AZSWAP_DEBUG=1, in build/kmod-SERIES-debug).
build() {
	local series=$1 variant=${2:-} rel out flags=()
	rel=$(release "$series")
	out="$top/build/kmod-$series"
	case "$variant" in
	"") ;;
	debug) out="$out-debug" flags=(AZSWAP_DEBUG=1) ;;
	*) die "build: unknown variant '$variant' (debug)" ;;
	esac
	case "$series" in
	6.1 | 6.12)
		copy_sources "$out"
		make -C "/lib/modules/$rel/build" M="$out" ${flags[@]+"${flags[@]}"} modules
		;;
	7.3)
		local src
		src="/build/azswap-$(echo "$top" | md5sum | cut -c1-8)${variant:+-$variant}"
		copy_sources "$root73$src"
		mountpoint -q "$root73/proc" || mount -t proc proc "$root73/proc"
		local rc=0
		in_root make -C "/usr/src/linux-headers-$rel" M="$src" ${flags[@]+"${flags[@]}"} modules || rc=$?
		umount "$root73/proc" 2>/dev/null || true
		[ "$rc" = 0 ] || exit "$rc"
		mkdir -p "$out/kmod"
		cp -p "$root73$src/kmod/azswap.ko" "$out/kmod/azswap.ko"
		;;
	esac
	ln -sfn kmod/azswap.ko "$out/azswap.ko"
	echo "kernels: $out/azswap.ko built for $rel" >&2
}

# DKMS builds the module for a series, installing nothing (a tree of its own in $2).
dkms_tree() {
	local series=$1 dir=$2 rel
	rel=$(release "$series")
	case "$series" in
	6.1 | 6.12)
		"$top/packaging/dkms-install.sh" --tree "$dir" -k "$rel"
		;;
	7.3)
		need_root "run DKMS in the 7.3 chroot"
		local src rc=0
		src="/build/azswap-dkms-$(echo "$top" | md5sum | cut -c1-8)"
		rm -rf "$root73$src"
		mkdir -p "$root73$src/packaging" "$root73$src/kmod"
		copy_sources "$root73$src"
		cp -p "$top/packaging/dkms-install.sh" "$root73$src/packaging/"
		cp -p "$top/pyproject.toml" "$root73$src/"
		cp -p "$top/kmod/dkms.conf" "$root73$src/kmod/"
		mountpoint -q "$root73/proc" || mount -t proc proc "$root73/proc"
		in_root sh "$src/packaging/dkms-install.sh" --tree "$src/tree" -k "$rel" || rc=$?
		umount "$root73/proc" 2>/dev/null || true
		[ "$rc" = 0 ] || exit "$rc"
		mkdir -p "$dir"
		find "$root73$src/tree/dkms" -name 'azswap.ko*' -exec cp -p {} "$dir/" \;
		;;
	esac
	find "$dir" -name 'azswap.ko*' | grep -q . || die "$series: DKMS built no azswap.ko"
	say "$series: DKMS built azswap.ko for $rel"
}

cmd=${1:-install}
[ $# -gt 0 ] && shift
case "$cmd" in
install)
	[ $# -gt 0 ] || set -- 6.12 7.3
	for s in "$@"; do
		case "$s" in
		6.1) ;;
		6.12) install_612 ;;
		7.3) install_73 ;;
		*) die "unknown series '$s' (6.1, 6.12 or 7.3)" ;;
		esac
	done
	;;
release | image)
	[ $# = 1 ] || die "usage: $0 $cmd SERIES"
	"$cmd" "$1"
	;;
build)
	[ $# = 1 ] || [ $# = 2 ] || die "usage: $0 build SERIES [debug]"
	build "$@"
	;;
dkms)
	[ $# = 2 ] || die "usage: $0 dkms SERIES DIR"
	dkms_tree "$1" "$2"
	;;
*) die "usage: $0 install|release|image|build|dkms [SERIES [debug|DIR]]" ;;
esac
