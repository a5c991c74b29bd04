// SPDX-License-Identifier: GPL-2.0
/*
 * A libFuzzer-less driver for fuzz_decode.c (when clang's libFuzzer is not
 * installed): feeds seed files and random mutations of them to
 * LLVMFuzzerTestOneInput for a given number of seconds.  Built with gcc
 * and ASan/UBSan by `make -f kmod/core/host.mk fuzz-gcc`.
 *
 *   azcore-fuzz-gcc SECONDS [SEED_FILE...]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXLEN 4200

static uint64_t rnd_state = 88172645463325252ULL;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

int main(int argc, char **argv)
{
	static uint8_t seeds[64][MAXLEN], buf[MAXLEN];
	size_t seedlen[64], n = 0, len, i, k;
	unsigned long runs = 0;
	time_t end;
	int a;

	if (argc < 2)
		return 2;
	end = time(NULL) + atoi(argv[1]);
	for (a = 2; a < argc && n < 64; a++) {
		FILE *f = fopen(argv[a], "rb");

		if (!f)
			continue;
		seedlen[n] = fread(seeds[n], 1, MAXLEN, f);
		fclose(f);
		LLVMFuzzerTestOneInput(seeds[n], seedlen[n]);
		n++;
	}
	while (time(NULL) < end) {
		for (i = 0; i < 1000; i++, runs++) {
			if (n && rnd() % 4) {
				size_t s = rnd() % n, edits = 1 + rnd() % 8;

				len = seedlen[s];
				memcpy(buf, seeds[s], len);
				for (k = 0; k < edits && len; k++)
					buf[rnd() % len] ^= 1 << (rnd() % 8);
				if (rnd() % 4 == 0 && len > 1)
					len = 1 + rnd() % len;
			} else {
				len = rnd() % MAXLEN;
				for (k = 0; k < len; k++)
					buf[k] = rnd();
			}
			LLVMFuzzerTestOneInput(buf, len);
		}
	}
	printf("azcore-fuzz-gcc: %lu runs, no crash\n", runs);
	return 0;
}
