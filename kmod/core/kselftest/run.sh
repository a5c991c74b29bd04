#!/bin/sh
# Build the store core alone as azcore_selftest.ko (a copy of kmod/core in a
# temporary directory, so nothing is written into the checkout) and load it
# in the test kernel through vm-tests/run: the module runs
# az_core_selftest() and az_core_stress() (4 kthreads, 3 s) at load and
# refuses to load if either fails.  Built as the debug module is: index
# moves of 8 buckets, trust groups judged every 64 similarity lookups.
#   kmod/core/kselftest/run.sh [KDIR]
# AZSWAP_VM_ARGS: more vm-tests/run options (--debug-kernel, with the debug
# kernel's tree as KDIR: KASAN, lockdep and kmemleak over the stress).
set -eu
top=$(cd "$(dirname "$0")/../../.." && pwd)
kdir=${1:-/lib/modules/$("$top/scripts/kver")/build}
tmp=$(mktemp -d /tmp/azcore-kselftest.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/core"
cp "$top"/kmod/core/*.c "$top"/kmod/core/*.h "$top/kmod/core/Kbuild.inc" "$tmp/core/"
cp "$top/kmod/core/kselftest/azcore_selftest.c" "$top/kmod/compat.h" "$tmp/"
cat > "$tmp/Kbuild" <<'KB'
include $(src)/core/Kbuild.inc
obj-m := azcore-selftest.o
azcore-selftest-y := azcore_selftest.o $(azcore-objs) $(azcore-selftest-objs)
ccflags-y := -Werror -DAZSWAP_SELFTEST -DAZ_MOVE_STEP=8 -DAZ_SIM_WINDOW=64
KB
make -s -C "$kdir" M="$tmp" modules
mods="zsmalloc lz4_decompress zstd_compress zstd_decompress"
# shellcheck disable=SC2086 # options, split as the shell does
"$top/vm-tests/run" ${AZSWAP_VM_ARGS:-} --timeout 900 -- sh -c "
	for m in $mods; do modprobe \$m; done
	insmod $tmp/azcore-selftest.ko || { dmesg | grep azswap; exit 1; }
	dmesg | grep -E 'azswap: (selftest|stress)'
	rmmod azcore_selftest"
