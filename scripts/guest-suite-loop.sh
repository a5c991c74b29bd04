#!/bin/bash
# Run the whole in-guest suite N times in a row and report every run that did not pass:
#   scripts/guest-suite-loop.sh [N] [extra vm-tests/run options, e.g. --debug-kernel]
# Each run is `pytest vm-tests/guest` (one guest boot); its console log, the runner's kernel
# log of a run that timed out (a hang) and pytest's summary land in vm-tests/out/loop/RUN/.
# AZSWAP_VM_TIMEOUT (default 1800 s) bounds one run, so a hang shows as a timeout.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-10}
shift || true
out=$top/vm-tests/out/loop
mkdir -p "$out"
export AZSWAP_VM_TIMEOUT=${AZSWAP_VM_TIMEOUT:-1800}
export AZSWAP_VM_ARGS="${AZSWAP_VM_ARGS:-} $*"
# what `make test` and `make test-debug` build first for the series the guest runs
# (AZSWAP_KERNEL, default 6.1): both module variants, the host library, the debug kernel when
# it is asked for
targets="kmod kmod-debug hostlib"
case " $AZSWAP_VM_ARGS " in *" --debug-kernel "*) targets="$targets debug-kernel" ;; esac
make -s -C "$top" KERNEL="${AZSWAP_KERNEL:-6.1}" $targets >"$out/build.log" 2>&1 || {
	echo "guest-suite-loop: make $targets failed (log: $out/build.log)"
	exit 1
}
pass=0
fail=0
for i in $(seq 1 "$n"); do
	d=$out/$i
	rm -rf "$d"
	mkdir -p "$d"
	t0=$SECONDS
	(cd "$top" && nice -n 10 .venv/bin/pytest -q -p no:cacheprovider vm-tests/guest) \
		>"$d/pytest.txt" 2>&1
	rc=$?
	# the console log as vm-tests/conftest.py names it: -debug, -SERIES or no suffix
	console=guest-console${AZSWAP_KERNEL:+-$AZSWAP_KERNEL}.log
	case " $AZSWAP_VM_ARGS " in *" --debug-kernel "*) console=guest-console-debug.log ;; esac
	cp "$top/vm-tests/out/$console" "$d/guest-console.log" 2>/dev/null
	hang=no
	if grep -q 'vm-tests/run: timed out' "$d/guest-console.log" 2>/dev/null; then
		hang=yes
		cp "$top/vm-tests/out/last-dmesg.txt" "$d/" 2>/dev/null
	fi
	last=$(grep -Eo '[^ ]*::[^ ]* (PASSED|FAILED|SKIPPED|ERROR)' "$d/guest-console.log" 2>/dev/null |
		tail -n 1)
	summary=$(tail -n 1 "$d/pytest.txt")
	echo "run $i: exit $rc, $((SECONDS - t0)) s, hang: $hang, last test: ${last:-none}; $summary"
	if [ "$rc" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done
echo "guest-suite-loop: $n runs, $pass passed, $fail failed (logs: $out)"
[ "$fail" = 0 ]
