# azswap: top-level entry points.  `make help` lists them.
SHELL := /bin/bash
TOP := $(CURDIR)
KVER ?= $(shell $(TOP)/scripts/kver 2>/dev/null)
KDIR ?= /lib/modules/$(KVER)/build
VENV := $(TOP)/.venv
PY := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest

# The first target is the default: `make` alone prints help.
.DEFAULT_GOAL := help

.PHONY: help setup setup-apt kmod hostlib test test-host test-vm lint demo bench clean

help:
	@echo "make setup    install Debian packages + .venv (idempotent)"
	@echo "make kmod     build kmod/azswap.ko against KDIR (default: the test kernel's headers)"
	@echo "make install  module + systemd units + config examples (KDIR=/lib/modules/\$$(uname -r)/build)"
	@echo "make dkms-install  the same module through DKMS, rebuilt for every kernel"
	@echo "make hostlib  build the store core as build/libazcore.so (+ ASan variant)"
	@echo "make test     host tests + in-guest tests under QEMU, one summary"
	@echo "make demo     sandbox fan-out in a QEMU guest: azswap vs zram/zswap"
	@echo "make bench    full evaluation report in bench-report/"

setup:
	@$(TOP)/scripts/setup.sh

setup-apt:
	@$(TOP)/scripts/setup.sh apt

# On a real host KDIR is given on the command line and nothing is installed for it.
kmod: $(if $(filter command line,$(origin KDIR)),,setup-apt)
	$(MAKE) -C $(KDIR) M=$(TOP) modules

hostlib: setup-apt
	$(MAKE) -f $(TOP)/kmod/core/host.mk TOP=$(TOP)

lint: setup
	$(VENV)/bin/ruff check controlplane cli ebpf examples tests vm-tests

# Host tests and guest tests run in one pytest session: vm-tests/conftest.py boots the
# test kernel once (vm-tests/run) for every in-guest test collected and reports each one.
test: setup kmod hostlib
	$(PYTEST) tests vm-tests/guest

test-host: setup hostlib
	$(PYTEST) tests

test-vm: setup kmod
	$(PYTEST) vm-tests/guest

demo: setup kmod hostlib
	$(PY) -m controlplane.demo $(DEMO_ARGS)

bench: setup kmod hostlib
	$(PY) -m controlplane.bench $(BENCH_ARGS)

include $(TOP)/packaging/install.mk

clean:
	-$(MAKE) -C $(KDIR) M=$(TOP) clean
	rm -rf build vm-tests/out
