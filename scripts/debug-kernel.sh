#!/bin/bash
# The debug-kernel tier's guest kernel and the azswap module built for it.
#
#   scripts/debug-kernel.sh build   build the kernel if it is not cached; print its directory
#   scripts/debug-kernel.sh module  build kmod/ against it (out of the checkout); print the .ko
#   scripts/debug-kernel.sh module-selftest  the same with the core's self-test (AZSWAP_DEBUG=1)
#   scripts/debug-kernel.sh dir     print the cache directory (exit 1 when not built yet)
#
# The kernel is Debian's linux-source-6.1 configured with virtme-ng's minimal config plus
# scripts/debug-kernel.config (KASAN, KFENCE, lockdep, kmemleak, fault injection, ...). It is
# cached in $AZSWAP_CACHE/debug-kernel/<source version>-<config hash>/ (AZSWAP_CACHE defaults
# to ~/.cache/azswap), so a new source package or a changed fragment builds a new one.
# The build log is build.log there; progress goes to stderr, the result to stdout.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
tarball=/usr/src/linux-source-6.1.tar.xz
fragment=$top/scripts/debug-kernel.config
cache_root=${AZSWAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/azswap}/debug-kernel

die() { echo "debug-kernel: $*" >&2; exit 1; }
say() { echo "debug-kernel: $*" >&2; }

find_vng() {
	local c
	for c in "$top/.venv/bin/vng" "$(command -v vng || true)"; do
		[ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
	done
	die "virtme-ng (vng) not found: run 'make setup'"
}

# <source version>-<hash of the fragment and the virtme-ng version that makes the base>
cache_dir() {
	[ -r "$tarball" ] || die "$tarball missing: run 'make setup' (package linux-source-6.1)"
	local ver vngver hash
	ver=$(dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null) || ver=unknown
	vngver=$("$(find_vng)" --version 2>/dev/null | head -n 1)
	hash=$({ cat "$fragment"; echo "$vngver"; } | sha256sum | cut -c1-12)
	echo "$cache_root/$ver-$hash"
}

progress() {
	# The whole log goes to $1; stderr gets a line per 100 compiled files.
	local n=0 line
	while IFS= read -r line; do
		printf '%s\n' "$line" >&3
		case $line in
		"  CC "* | "  AS "* | "  AR "* | "  LD "*)
			n=$((n + 1))
			[ $((n % 100)) -ne 0 ] || say "$n files built (${line##* })"
			;;
		*error:* | *"Error "[0-9]*) echo "$line" >&2 ;;
		esac
	done 3>"$1"
}

build() {
	local dir src vng
	dir=$(cache_dir)
	src=$dir/linux
	if [ -e "$dir/.done" ]; then
		echo "$dir"
		return
	fi
	mkdir -p "$dir"
	# One build at a time per cache directory; a second caller waits for the first.
	exec 9>"$dir/.lock"
	if ! flock -n 9; then
		say "another build of $dir is running; waiting for it"
		flock 9
	fi
	if [ -e "$dir/.done" ]; then
		echo "$dir"
		return
	fi
	vng=$(find_vng)
	say "building the debug kernel in $dir (about 1 h on 2 CPUs; log: $dir/build.log)"
	if [ ! -e "$src/.extracted" ]; then
		say "extracting $tarball"
		rm -rf "$src" "$dir/tmp"
		mkdir -p "$dir/tmp"
		tar -C "$dir/tmp" -xf "$tarball"
		mv "$dir/tmp"/linux-source-* "$src"
		rmdir "$dir/tmp"
		touch "$src/.extracted"
	fi
	if [ ! -e "$src/.configured" ] || [ "$fragment" -nt "$src/.configured" ]; then
		say "configuring (virtme-ng minimal config + $(basename "$fragment"))"
		(cd "$src" && PATH="$(dirname "$vng"):$PATH" "$vng" --kconfig --force --config "$fragment") >"$dir/config.log" 2>&1 ||
			{ tail -n 30 "$dir/config.log" >&2; die "configuration failed (see $dir/config.log)"; }
		# virtme-ng appends its own generic options after the fragment (debug info among
		# them): merge the fragment once more so it wins, then let Kconfig settle.
		(cd "$src" && scripts/kconfig/merge_config.sh -m .config "$fragment" &&
			make olddefconfig) >>"$dir/config.log" 2>&1 ||
			die "merging $fragment failed (see $dir/config.log)"
		check_config "$src/.config"
		touch "$src/.configured"
	fi
	say "compiling with nice -n 10 make -j$(nproc)"
	local t0=$SECONDS
	if ! (cd "$src" && nice -n 10 make -j"$(nproc)" bzImage modules 2>&1) | progress "$dir/build.log"; then
		tail -n 30 "$dir/build.log" >&2
		die "build failed (see $dir/build.log)"
	fi
	# Modules that are =m land in the tree's own modules directory for the guest.
	(cd "$src" && make -s INSTALL_MOD_PATH="$dir/mods" modules_install) >>"$dir/build.log" 2>&1 ||
		die "modules_install failed (see $dir/build.log)"
	make -s -C "$src" kernelrelease >"$dir/release"
	echo "$((SECONDS - t0))" >"$dir/build-seconds"
	ln -sf linux/arch/x86/boot/bzImage "$dir/bzImage"
	touch "$dir/.done"
	say "built $(cat "$dir/release") in $((SECONDS - t0)) s"
	echo "$dir"
}

# Every option the tier promises must have survived olddefconfig (a missing dependency drops
# it silently).
check_config() {
	local cfg=$1 want missing=""
	for want in KASAN KFENCE PROVE_LOCKING DEBUG_ATOMIC_SLEEP PROVE_RCU DEBUG_VM DEBUG_LIST \
		DEBUG_KMEMLEAK DETECT_HUNG_TASK SOFTLOCKUP_DETECTOR FAULT_INJECTION FAILSLAB \
		FAIL_PAGE_ALLOC FAULT_INJECTION_DEBUG_FS MODULES MODULE_UNLOAD ZSMALLOC LZ4_COMPRESS \
		LZ4_DECOMPRESS ZSTD_COMPRESS ZSTD_DECOMPRESS XXHASH MEMCG SWAP BLK_DEV \
		DEBUG_FS FTRACE KPROBES KPROBE_EVENTS BPF_SYSCALL BPF_EVENTS TRANSPARENT_HUGEPAGE \
		ZRAM ZSWAP NET_9P_VIRTIO 9P_FS IKHEADERS DEBUG_INFO_BTF; do
		grep -Eq "^CONFIG_${want}=(y|m)" "$cfg" || missing="$missing $want"
	done
	[ -z "$missing" ] || die "config lacks:$missing (see $cfg)"
}

# kmod/ copied into the cache and built there against the debug tree, so the stock build's
# objects in the checkout are left alone.
# $1: module (the production build) or module-selftest (AZSWAP_DEBUG=1: with the store
# core's self-test, as `make kmod-debug` builds it for the stock kernel).
module() {
	local dir out extra=""
	dir=$(cache_dir)
	[ -e "$dir/.done" ] || dir=$(build)
	out=$dir/$1
	[ "$1" = module-selftest ] && extra="AZSWAP_DEBUG=1"
	exec 8>"$dir/.module-lock"
	flock 8
	mkdir -p "$out"
	# The sources only (mtimes kept, so a rebuild is incremental); never the checkout's objects.
	tar -C "$top" -cf - --exclude='*.o' --exclude='*.ko' --exclude='*.mod' --exclude='*.mod.c' \
		--exclude='.*.cmd' --exclude='Module.symvers' --exclude='modules.order' \
		--exclude='kmod/core/fuzz' --exclude='kmod/core/host' Kbuild kmod | tar -C "$out" -xf -
	# shellcheck disable=SC2086
	if ! make -s -C "$dir/linux" M="$out" $extra modules >"$out.log" 2>&1; then
		cat "$out.log" >&2
		die "module build against the debug kernel failed"
	fi
	echo "$out/kmod/azswap.ko"
}

case "${1:-build}" in
build) build ;;
module | module-selftest) module "$1" ;;
dir)
	d=$(cache_dir)
	[ -e "$d/.done" ] || { echo "$d"; exit 1; }
	echo "$d"
	;;
*) die "usage: $0 build|module|module-selftest|dir" ;;
esac
