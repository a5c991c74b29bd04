// SPDX-License-Identifier: GPL-2.0
/*
 * Host driver for az_core_stress() (selftest.c), built with ASan or TSan
 * by host.mk (stress, stress-tsan):
 *
 *   azcore-stress THREADS SECONDS
 *
 * The kernel runs the same function from kmod/core/kselftest.
 */
#include <stdio.h>
#include <stdlib.h>

#include "az_debug_host.h"

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	int secs = argc > 2 ? atoi(argv[2]) : 5;
	int err;

	err = az_core_stress(nthreads, secs * 1000);
	printf("stress: %s (%d)\n", err ? "FAILED" : "ok", err);
	return err ? 1 : 0;
}
