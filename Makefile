# azswap: top-level entry points.  `make help` lists them.
SHELL := /bin/bash
TOP := $(CURDIR)
# Kernel series to build for and boot: 6.1 (Debian 12, the default), 6.12 or 7.3.
KERNEL ?= 6.1
KVER ?= $(shell $(TOP)/scripts/kver 2>/dev/null)
KDIR ?= /lib/modules/$(KVER)/build
VENV := $(TOP)/.venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest

# The first target is the default: `make` alone prints help.
.DEFAULT_GOAL := help

.PHONY: help setup setup-apt kmod kmod-debug kmod-debug-all kmod-all hostlib test test-host test-vm \
	test-kernels test-debug debug-kernel soak lint demo bench bench-phase clean

help:
	@echo "make setup    install Debian packages + .venv (idempotent)"
	@echo "make kmod     build kmod/azswap.ko against KDIR (default: the test kernel's headers)"
	@echo "make kmod-debug  the module with the store core's self-test (AZSWAP_DEBUG=1) as $(KMOD_DEBUG)"
	@echo "                 (KERNEL=6.12|7.3: build/kmod-SERIES-debug; make kmod-debug-all: every series)"
	@echo "make kmod KERNEL=6.12|7.3  build build/kmod-SERIES/azswap.ko for that series"
	@echo "make install  module + systemd units + config examples (KDIR=/lib/modules/\$$(uname -r)/build)"
	@echo "make dkms-install  the same module through DKMS, rebuilt for every kernel"
	@echo "make hostlib  build the store core as build/libazcore.so (+ ASan variant)"
	@echo "make test     host tests + the in-guest tests under QEMU on every series (6.1, 6.12, 7.3)"
	@echo "make test-kernels  the whole guest suite on each of 6.1, 6.12 and 7.3"
	@echo "make test-host / test-vm  the host tests / the guest suite on one series (KERNEL=6.12|7.3)"
	@echo "make test-debug  the in-guest tests on the debug kernel (KASAN, lockdep, kmemleak, ...)"
	@echo "make soak     SOAK_MINUTES=N (30) of swap stress + netlink churn on the debug kernel"
	@echo "make debug-kernel  build (or find cached) the debug kernel (DEBUG_KERNEL=1 make setup too)"
	@echo "make demo     sandbox fan-out in a QEMU guest: azswap vs zram/zswap"
	@echo "make bench    full evaluation report in bench-report/ (KERNEL=6.12|7.3: the guest on that series)"
	@echo "make bench-phase  tool phases through the daemon, idle and loaded: bench-report/phase.json"

setup:
	@AZSWAP_SETUP_DEBUG_KERNEL=$(DEBUG_KERNEL) $(TOP)/scripts/setup.sh

setup-apt:
	@$(TOP)/scripts/setup.sh apt

# On a real host KDIR is given on the command line and nothing is installed for it.
# KERNEL=6.1 (the default) builds in the checkout: kmod/azswap.ko.  Another series builds
# from a copy of the sources in build/kmod-SERIES/ (its own objects): build/kmod-SERIES/azswap.ko,
# which `vm-tests/run --kernel SERIES` loads as kmod/azswap.ko in the guest.
ifeq ($(origin KDIR)$(KERNEL),file6.1)
kmod: setup-apt
	$(MAKE) -C $(KDIR) M=$(TOP) modules
else ifeq ($(origin KDIR),command line)
kmod:
	$(MAKE) -C $(KDIR) M=$(TOP) modules
else
kmod: setup-apt
	@$(TOP)/scripts/kernels.sh install $(KERNEL)
	@$(TOP)/scripts/kernels.sh build $(KERNEL)
endif

# The debug variant (self-test and its stress threads, `selftest` parameter)
# is built from a copy of the sources so that kmod/azswap.ko stays the
# production module; `make kmod AZSWAP_DEBUG=1` builds it in place instead.
KMOD_DEBUG_DIR := $(TOP)/build/kmod-debug
KMOD_DEBUG := $(KMOD_DEBUG_DIR)/kmod/azswap.ko
# Another series' self-test build: build/kmod-SERIES-debug (`make kmod-debug KERNEL=6.12`), which
# `vm-tests/run --kernel SERIES` mounts over build/kmod-debug/kmod in the guest.
ifneq ($(KERNEL),6.1)
ifneq ($(origin KDIR),command line)
KMOD_DEBUG_SERIES := $(KERNEL)
endif
endif
ifdef KMOD_DEBUG_SERIES
kmod-debug: setup-apt
	@$(TOP)/scripts/kernels.sh install $(KERNEL)
	@$(TOP)/scripts/kernels.sh build $(KERNEL) debug
else
kmod-debug: $(if $(filter command line,$(origin KDIR)),,setup-apt)
	rm -rf $(KMOD_DEBUG_DIR) && mkdir -p $(KMOD_DEBUG_DIR)
	cp -r $(TOP)/kmod $(TOP)/Kbuild $(KMOD_DEBUG_DIR)/
	find $(KMOD_DEBUG_DIR) \( -name '*.o' -o -name '*.ko' -o -name '.*.cmd' -o -name '*.mod' \
		-o -name '*.mod.c' -o -name modules.order \) -delete
	$(MAKE) -C $(KDIR) M=$(KMOD_DEBUG_DIR) AZSWAP_DEBUG=1 modules
endif

kmod-debug-all: setup-apt
	@for s in $(SERIES); do $(MAKE) --no-print-directory kmod-debug KERNEL=$$s || exit 1; done

hostlib: setup-apt
	$(MAKE) -f $(TOP)/kmod/core/host.mk TOP=$(TOP)

lint: setup
	$(VENV)/bin/ruff check controlplane cli ebpf bench examples tests vm-tests

# Host tests and guest tests run in one pytest session: vm-tests/conftest.py boots the
# test kernel once (vm-tests/run) for every in-guest test collected and reports each one.
# The whole guest suite runs on the default series (6.1) with the host tests, then on each
# other series (6.12, 7.3), one guest boot each; every series runs even when one fails.
SERIES := 6.1 6.12 7.3
OTHER_SERIES := 6.12 7.3
test: setup kmod-all kmod-debug-all hostlib
	@rc=0; $(PYTEST) tests vm-tests/guest || rc=1; \
	for s in $(OTHER_SERIES); do echo "== guest suite on $$s"; \
	  AZSWAP_KERNEL=$$s $(PYTEST) vm-tests/guest || rc=1; done; exit $$rc

test-host: setup hostlib
	$(PYTEST) tests

# The guest suite on one series: KERNEL's modules, booted in KERNEL's test kernel.
test-vm: setup kmod kmod-debug
	AZSWAP_KERNEL=$(filter-out 6.1,$(KERNEL)) $(PYTEST) vm-tests/guest

kmod-all: setup-apt
	@for s in $(SERIES); do $(MAKE) --no-print-directory kmod KERNEL=$$s || exit 1; done

# The full guest suite once per series (vm-tests/conftest.py passes AZSWAP_KERNEL on to
# vm-tests/run); every series runs even when one fails.
test-kernels: setup kmod-all kmod-debug-all
	@rc=0; for s in $(SERIES); do echo "== guest suite on $$s"; \
	  AZSWAP_KERNEL=$$s $(PYTEST) vm-tests/guest || rc=1; done; exit $$rc

# The debug-kernel tier: its kernel is built once (10-28 min on 2 idle CPUs, cached in
# ~/.cache/azswap) and the module against it, out of the checkout; KASAN under TCG is slow,
# hence the longer guest timeout.
DEBUG_VM_TIMEOUT ?= 7200
SOAK_MINUTES ?= 30

debug-kernel: setup
	@$(TOP)/scripts/debug-kernel.sh build >/dev/null

test-debug: debug-kernel kmod-debug
	AZSWAP_VM_ARGS=--debug-kernel AZSWAP_VM_TIMEOUT=$(DEBUG_VM_TIMEOUT) $(PYTEST) vm-tests/guest

soak: debug-kernel
	$(TOP)/vm-tests/run --debug-kernel --memory 2G --timeout $$(( $(SOAK_MINUTES) * 60 + 1800 )) \
		-- env PYTHONPATH=$(TOP) $(PY) vm-tests/guest/soak.py --minutes $(SOAK_MINUTES)

demo: setup kmod hostlib
	$(PY) -m bench.demo $(DEMO_ARGS)

# `make bench KERNEL=6.12` runs the guest part on that series (the module built for it; the
# default series' kmod/azswap.ko must exist too: the guest mounts the other one over it).
bench: setup kmod hostlib
	@[ "$(KERNEL)" = 6.1 ] || $(MAKE) --no-print-directory kmod KERNEL=6.1
	$(PY) -m bench --kernel $(KERNEL) $(BENCH_ARGS)

# The phase benchmark through the daemon in one guest (idle and loaded hosts, ml and coding
# styles); BENCH_ARGS go to bench.phasebench (e.g. --repeat 3).  The guest writes under
# vm-tests/out; the JSON is copied to bench-report/phase.json once the guest run succeeded.
PHASE_MEMORY ?= 2G
# the guest's time limit, a safety net: one repeat takes about 20 minutes under TCG
PHASE_TIMEOUT ?= 7200
bench-phase: setup kmod
	@rm -f $(TOP)/vm-tests/out/phase/phase.json
	$(TOP)/vm-tests/run --memory $(PHASE_MEMORY) --timeout $(PHASE_TIMEOUT) -- \
		$(PY) -m bench.phasebench --json $(TOP)/vm-tests/out/phase/phase.json $(BENCH_ARGS)
	@mkdir -p $(TOP)/bench-report
	cp $(TOP)/vm-tests/out/phase/phase.json $(TOP)/bench-report/phase.json
	@echo "bench-report/phase.json"

include $(TOP)/packaging/install.mk

clean:
	-$(MAKE) -C $(KDIR) M=$(TOP) clean
	rm -rf build vm-tests/out
