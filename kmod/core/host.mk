# SPDX-License-Identifier: GPL-2.0
#
# Host build of the store core: the same kmod/core/*.c the module uses,
# with the host shim (kmod/core/host/az_shim_host.c) in place of the
# kernel one.
#
#   make -f kmod/core/host.mk          build/libazcore.so + build/libazcore-asan.so
#   make -f kmod/core/host.mk fuzz     build/azcore-fuzz (libFuzzer, needs clang)
#
# The top-level Makefile's `hostlib` target runs this file.

AZ_TOP   ?= $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
AZ_CORE  := $(AZ_TOP)/kmod/core
AZ_BUILD ?= $(AZ_TOP)/build

AZ_SRCS := $(filter-out $(AZ_CORE)/az_shim_kernel.c,$(wildcard $(AZ_CORE)/*.c)) \
	   $(AZ_CORE)/host/az_shim_host.c $(AZ_CORE)/host/az_debug_host.c
AZ_HDRS := $(wildcard $(AZ_CORE)/*.h)

AZ_CC      ?= cc
AZ_CFLAGS  := -std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror \
	      -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers \
	      -fvisibility=default -pthread
AZ_LDLIBS  := -llz4 -lzstd -pthread
AZ_ASAN    := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
	      -fno-sanitize-recover=undefined

.PHONY: all hostlib fuzz clean-hostlib
all hostlib: $(AZ_BUILD)/libazcore.so $(AZ_BUILD)/libazcore-asan.so

$(AZ_BUILD)/libazcore.so: $(AZ_SRCS) $(AZ_HDRS)
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) -shared -o $@ $(AZ_SRCS) $(AZ_LDLIBS)

$(AZ_BUILD)/libazcore-asan.so: $(AZ_SRCS) $(AZ_HDRS)
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) $(AZ_ASAN) -shared -o $@ $(AZ_SRCS) $(AZ_LDLIBS)

fuzz: $(AZ_BUILD)/azcore-fuzz

$(AZ_BUILD)/azcore-fuzz: $(AZ_SRCS) $(AZ_HDRS) $(AZ_CORE)/fuzz/fuzz_decode.c
	@mkdir -p $(AZ_BUILD)
	clang -std=gnu11 -O1 -g -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Wall -Werror \
		-Wno-unused-parameter -o $@ $(AZ_SRCS) $(AZ_CORE)/fuzz/fuzz_decode.c \
		$(AZ_LDLIBS)

clean-hostlib:
	rm -f $(AZ_BUILD)/libazcore.so $(AZ_BUILD)/libazcore-asan.so $(AZ_BUILD)/azcore-fuzz
