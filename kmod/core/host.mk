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
AZ_HDRS := $(wildcard $(AZ_CORE)/*.h $(AZ_CORE)/host/*.h)

AZ_CC      ?= cc
AZ_CFLAGS  := -std=gnu11 -O2 -g -fPIC -Wall -Wextra -Werror \
	      -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers \
	      -fvisibility=default -pthread
AZ_LDLIBS  := -llz4 -lzstd -pthread
AZ_ASAN    := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer \
	      -fno-sanitize-recover=undefined

.PHONY: all hostlib fuzz fuzz-gcc planted stress clean-hostlib
all hostlib: $(AZ_BUILD)/libazcore.so $(AZ_BUILD)/libazcore-asan.so

$(AZ_BUILD)/libazcore.so: $(AZ_SRCS) $(AZ_HDRS)
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) -shared -o $@ $(AZ_SRCS) $(AZ_LDLIBS)

$(AZ_BUILD)/libazcore-asan.so: $(AZ_SRCS) $(AZ_HDRS)
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) $(AZ_ASAN) -shared -o $@ $(AZ_SRCS) $(AZ_LDLIBS)

# The ASan library with a deliberate off-by-one in the host pool: proves
# that tests/core/test_asan.py catches a real memory bug.
planted: $(AZ_BUILD)/libazcore-asan-planted.so

$(AZ_BUILD)/libazcore-asan-planted.so: $(AZ_SRCS) $(AZ_HDRS)
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) $(AZ_ASAN) -DAZ_PLANT_OOB -shared -o $@ $(AZ_SRCS) $(AZ_LDLIBS)

fuzz: $(AZ_BUILD)/azcore-fuzz

# LZ4_SRC=<dir with lz4.c and lz4.h> (e.g. the lz4libs/ of python-lz4's
# sdist) compiles lz4 into the target, instrumented, instead of linking
# the system liblz4: coverage guidance and ASan then reach the lz4 decoder.
LZ4_SRC ?=
AZ_FUZZ_LZ4 := $(if $(LZ4_SRC),-I$(LZ4_SRC) $(LZ4_SRC)/lz4.c,)
AZ_FUZZ_LIBS := $(if $(LZ4_SRC),-lzstd -pthread,$(AZ_LDLIBS))

$(AZ_BUILD)/azcore-fuzz: $(AZ_SRCS) $(AZ_HDRS) $(AZ_CORE)/fuzz/fuzz_decode.c
	@mkdir -p $(AZ_BUILD)
	clang -std=gnu11 -O1 -g -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Wall -Werror \
		-Wno-unused-parameter -o $@ $(AZ_SRCS) $(AZ_CORE)/fuzz/fuzz_decode.c \
		$(AZ_FUZZ_LZ4) $(AZ_FUZZ_LIBS)

# Same target without libFuzzer (gcc + ASan/UBSan, random mutations).
fuzz-gcc: $(AZ_BUILD)/azcore-fuzz-gcc

$(AZ_BUILD)/azcore-fuzz-gcc: $(AZ_SRCS) $(AZ_HDRS) $(AZ_CORE)/fuzz/fuzz_decode.c \
		$(AZ_CORE)/fuzz/standalone.c
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) $(AZ_ASAN) -o $@ $(AZ_SRCS) $(AZ_CORE)/fuzz/fuzz_decode.c \
		$(AZ_CORE)/fuzz/standalone.c $(AZ_LDLIBS)

# Multi-threaded stress (host/stress.c) under ASan or TSan.  Index resizes
# move 4 buckets per lock hold there, so the workers meet half-moved tables,
# and trust groups are judged sparse or dense every 64 similarity lookups.
stress: $(AZ_BUILD)/azcore-stress $(AZ_BUILD)/azcore-stress-tsan
AZ_STRESS_FLAGS := -DAZ_MOVE_STEP=4 -DAZ_SIM_WINDOW=64

$(AZ_BUILD)/azcore-stress: $(AZ_SRCS) $(AZ_HDRS) $(AZ_CORE)/host/stress.c
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) $(AZ_ASAN) $(AZ_STRESS_FLAGS) -o $@ $(AZ_SRCS) \
		$(AZ_CORE)/host/stress.c $(AZ_LDLIBS)

$(AZ_BUILD)/azcore-stress-tsan: $(AZ_SRCS) $(AZ_HDRS) $(AZ_CORE)/host/stress.c
	@mkdir -p $(AZ_BUILD)
	$(AZ_CC) $(AZ_CFLAGS) -O1 -fsanitize=thread $(AZ_STRESS_FLAGS) -o $@ $(AZ_SRCS) \
		$(AZ_CORE)/host/stress.c $(AZ_LDLIBS)

clean-hostlib:
	rm -f $(AZ_BUILD)/libazcore.so $(AZ_BUILD)/libazcore-asan.so \
		$(AZ_BUILD)/libazcore-asan-planted.so $(AZ_BUILD)/azcore-fuzz \
		$(AZ_BUILD)/azcore-fuzz-gcc $(AZ_BUILD)/azcore-stress $(AZ_BUILD)/azcore-stress-tsan
