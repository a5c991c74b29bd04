#!/bin/bash
# Idempotent set-up for azswap development, tests and the demo.
#   scripts/setup.sh apt   - Debian packages only (kernel image + headers, QEMU, bcc, libs)
#   scripts/setup.sh       - packages, the other kernel series (scripts/kernels.sh: 6.12, 7.3),
#                            then .venv (Debian python3, system site packages for bcc)
#   AZSWAP_SETUP_DEBUG_KERNEL=1 scripts/setup.sh   - and the debug-kernel tier's kernel
#                            (scripts/debug-kernel.sh; otherwise built on first use)
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
APT_PKGS="linux-image-amd64 linux-headers-amd64 qemu-system-x86 python3-bpfcc bpfcc-tools
  kmod python3-venv python3-dev busybox-static cpio liblz4-dev libzstd-dev libxxhash-dev
  linux-source-6.1 xz-utils udev gcc make util-linux procps clang libclang-rt-14-dev
  dkms shellcheck zstd debootstrap flex bison libelf-dev bc libssl-dev pahole"

need_apt() {
	for p in $APT_PKGS; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || return 0
	done
	# The headers must match the image the metapackage points at.
	rel=$("$top/scripts/kver" 2>/dev/null) || return 0
	[ -e "/lib/modules/$rel/build/Makefile" ] && [ -e "/boot/vmlinuz-$rel" ] || return 0
	return 1
}

if need_apt; then
	[ "$(id -u)" = 0 ] || { echo "setup: need root to apt-get install" >&2; exit 1; }
	echo "setup: installing Debian packages"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	# shellcheck disable=SC2086
	apt-get install -y -q --no-install-recommends $APT_PKGS
fi
[ "${1:-}" = apt ] && exit 0

"$top/scripts/kernels.sh" install

venv="$top/.venv"
stamp="$venv/.azswap-setup"
if [ ! -x "$venv/bin/python" ]; then
	echo "setup: creating $venv"
	/usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if [ ! -e "$stamp" ] || [ "$top/pyproject.toml" -nt "$stamp" ]; then
	echo "setup: installing Python packages"
	"$venv/bin/pip" install -q --disable-pip-version-check -e "${top}[test]"
	touch "$stamp"
fi
if [ "${AZSWAP_SETUP_DEBUG_KERNEL:-}" = 1 ]; then
	"$top/scripts/debug-kernel.sh" build >/dev/null
fi
