#!/bin/sh
# Install azswap on this host (what `make install` / `make uninstall` run).
#
#   packaging/install.sh module      kmod/azswap.ko -> /lib/modules/REL/updates/azswap.ko, depmod
#   packaging/install.sh files       setup script, systemd units, config examples, azctl link
#   packaging/install.sh all         module + files
#   packaging/install.sh uninstall   stop and disable the units, remove what was installed
#
# module: REL is the kernel the module was built for (its vermagic), not necessarily the
#   running one.  With AZSWAP_SIGN_KEY and AZSWAP_SIGN_CERT set, the installed copy is signed
#   with them (Secure Boot: a key enrolled as MOK, see docs/install.md).
# files:  PREFIX/sbin/azswap-swap-setup, /etc/systemd/system/azswap-swap.service and
#   azswap-daemon.service (from controlplane/systemd/), /etc/default/azswap and
#   /etc/modprobe.d/azswap.conf (only when absent: yours are kept), and PREFIX/bin/azctl as a
#   link to AZCTL when no azctl is there.  Nothing is enabled or started.
# uninstall: config files are removed only when unchanged from the shipped examples.
#
# Environment: DESTDIR (staging root; no depmod/systemctl then), PREFIX (/usr/local),
#   KO (kmod/azswap.ko), KDIR (headers for sign-file; default /lib/modules/REL/build),
#   AZCTL (.venv/bin/azctl of this checkout).  Needs root unless DESTDIR is set.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
pkg=$top/packaging
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
KO=${KO:-$top/kmod/azswap.ko}
AZCTL=${AZCTL:-$top/.venv/bin/azctl}
SBIN=$PREFIX/sbin
UNITDIR=/etc/systemd/system
DAEMON_UNIT=$top/controlplane/systemd/azswap-daemon.service

log() { echo "install: $*"; }
die() { echo "install: $*" >&2; exit 1; }

[ -n "$DESTDIR" ] || [ "$(id -u)" = 0 ] || die "needs root (or DESTDIR=...)"

have_systemd() { [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; }

release_of() { # the kernel release a .ko was built for
	modinfo -F vermagic "$1" | awk '{ print $1 }'
}

install_module() {
	[ -f "$KO" ] || die "$KO not built (make kmod KDIR=/lib/modules/\$(uname -r)/build)"
	rel=$(release_of "$KO")
	[ -n "$rel" ] || die "no vermagic in $KO"
	dir=$DESTDIR/lib/modules/$rel/updates
	mkdir -p "$dir"
	tmp=$(mktemp "$dir/.azswap.ko.XXXXXX")
	cp "$KO" "$tmp"
	if [ -n "${AZSWAP_SIGN_KEY:-}" ] || [ -n "${AZSWAP_SIGN_CERT:-}" ]; then
		if [ ! -r "${AZSWAP_SIGN_KEY:-}" ] || [ ! -r "${AZSWAP_SIGN_CERT:-}" ]; then
			rm -f "$tmp"
			die "set both AZSWAP_SIGN_KEY and AZSWAP_SIGN_CERT (readable files)"
		fi
		if [ -n "$(modinfo -F signer "$KO")" ]; then
			rm -f "$tmp"
			die "$KO is already signed: rebuild it (make kmod) and install again"
		fi
		kdir=${KDIR:-/lib/modules/$rel/build}
		[ -x "$kdir/scripts/sign-file" ] || { rm -f "$tmp"; die "no $kdir/scripts/sign-file"; }
		"$kdir/scripts/sign-file" sha256 "$AZSWAP_SIGN_KEY" "$AZSWAP_SIGN_CERT" "$tmp"
		log "signed with $AZSWAP_SIGN_CERT"
	fi
	chmod 0644 "$tmp"
	mv -f "$tmp" "$dir/azswap.ko"
	log "$dir/azswap.ko (kernel $rel)"
	if [ -e "$DESTDIR/lib/modules/$rel/updates/dkms/azswap.ko" ]; then
		echo "install: warning: DKMS also installed azswap for $rel;" \
			"remove one (packaging/dkms-install.sh --uninstall)" >&2
	fi
	if [ -z "$DESTDIR" ]; then
		depmod -a "$rel"
		[ "$(modinfo -k "$rel" -F filename azswap 2>/dev/null)" = "$dir/azswap.ko" ] ||
			echo "install: warning: modprobe -S $rel azswap does not pick $dir/azswap.ko" >&2
	fi
}

# install_conf SRC DST: a config example, never over an existing file.
install_conf() {
	if [ -e "$DESTDIR$2" ]; then
		log "$2 exists: kept (example: $1)"
	else
		install -D -m 0644 "$1" "$DESTDIR$2"
		log "$2"
	fi
}

install_files() {
	install -D -m 0755 "$pkg/azswap-swap-setup" "$DESTDIR$SBIN/azswap-swap-setup"
	log "$SBIN/azswap-swap-setup"
	mkdir -p "$DESTDIR$UNITDIR"
	sed "s|/usr/local/sbin/|$SBIN/|g" "$pkg/systemd/azswap-swap.service" \
		> "$DESTDIR$UNITDIR/azswap-swap.service"
	chmod 0644 "$DESTDIR$UNITDIR/azswap-swap.service"
	log "$UNITDIR/azswap-swap.service"
	if [ -f "$DAEMON_UNIT" ]; then
		sed "s|/usr/local/bin/azctl|$PREFIX/bin/azctl|g" "$DAEMON_UNIT" \
			> "$DESTDIR$UNITDIR/azswap-daemon.service"
		chmod 0644 "$DESTDIR$UNITDIR/azswap-daemon.service"
		log "$UNITDIR/azswap-daemon.service"
	fi
	install_conf "$pkg/default/azswap" /etc/default/azswap
	install_conf "$pkg/modprobe.d/azswap.conf" /etc/modprobe.d/azswap.conf
	link=$DESTDIR$PREFIX/bin/azctl
	if [ -e "$link" ] || [ -L "$link" ]; then
		log "$PREFIX/bin/azctl exists: kept"
	elif [ -x "$AZCTL" ]; then
		mkdir -p "$DESTDIR$PREFIX/bin"
		ln -s "$AZCTL" "$link"
		log "$PREFIX/bin/azctl -> $AZCTL"
	else
		echo "install: warning: no $AZCTL (make setup): azswap-daemon.service needs $PREFIX/bin/azctl" >&2
	fi
	if have_systemd; then
		systemctl daemon-reload
	fi
}

# remove_conf SRC DST: only when unchanged from the example.
remove_conf() {
	if [ -e "$DESTDIR$2" ]; then
		if cmp -s "$1" "$DESTDIR$2"; then
			rm -f "$DESTDIR$2"
			log "removed $2"
		else
			log "$2 changed by you: kept"
		fi
	fi
}

uninstall() {
	if have_systemd; then
		for u in azswap-daemon.service azswap-swap.service; do
			if [ -e "$UNITDIR/$u" ]; then
				systemctl disable --now "$u" || die "cannot stop $u"
			fi
		done
	fi
	rm -f "$DESTDIR$UNITDIR/azswap-swap.service" "$DESTDIR$UNITDIR/azswap-daemon.service" \
		"$DESTDIR$SBIN/azswap-swap-setup"
	if [ -L "$DESTDIR$PREFIX/bin/azctl" ] &&
		[ "$(readlink "$DESTDIR$PREFIX/bin/azctl")" = "$AZCTL" ]; then
		rm -f "$DESTDIR$PREFIX/bin/azctl"
	fi
	remove_conf "$pkg/default/azswap" /etc/default/azswap
	remove_conf "$pkg/modprobe.d/azswap.conf" /etc/modprobe.d/azswap.conf
	if have_systemd; then
		systemctl daemon-reload
	fi
	for f in "$DESTDIR"/lib/modules/*/updates/azswap.ko; do
		[ -e "$f" ] || continue
		rel=${f#"$DESTDIR"/lib/modules/}
		rel=${rel%%/*}
		rm -f "$f"
		log "removed $f"
		if [ -z "$DESTDIR" ]; then
			depmod -a "$rel"
		fi
	done
	if [ -z "$DESTDIR" ] && [ -d /sys/module/azswap ]; then
		log "azswap is still loaded: swapoff /dev/azswapN && rmmod azswap"
	fi
}

case ${1:-} in
module) install_module ;;
files) install_files ;;
all) install_module; install_files ;;
uninstall) uninstall ;;
*) sed -n '2,21s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
