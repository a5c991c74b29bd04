// SPDX-License-Identifier: GPL-2.0
/*
 * Patterned pages for the in-guest tests: every page's content is a pure
 * function of (seed, page number, variant), so a verifier regenerates it
 * and compares all 4096 bytes.  Built at test time into /tmp as a shared
 * library (azpages.py loads it with ctypes) so that the tests can
 * orchestrate with Python (fork, cgroups) and fill/verify at C speed.
 *
 * Kinds (chosen per page from the seed and the page number):
 *   zero         all zero
 *   same         one repeated 8-byte word
 *   text         compressible: repeated words with page-specific numbers
 *   random       incompressible
 *   neardup      one of 16 per-seed base pages with a few words changed
 *   heap         pointer-rich: small integers and pointer-like values
 * Every non-zero, non-same page starts with a 32-byte header (magic, seed,
 * page number, variant) so a misplaced page is reported clearly.
 *
 * Variants model forked sandboxes: variant v > 0 rewrites a few 8-byte
 * words of one page in az_edit_every, touching only those words (so the
 * other pages stay shared copy-on-write with the template).
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

#define PG 4096
#define WORDS (PG / 8)

static uint64_t mix(uint64_t v)
{
	v ^= v >> 33;
	v *= 0xff51afd7ed558ccdULL;
	v ^= v >> 33;
	v *= 0xc4ceb9fe1a85ec53ULL;
	v ^= v >> 33;
	return v;
}

int az_kind(uint64_t seed, uint64_t i)
{
	uint64_t h = mix(seed * 0x9e3779b97f4a7c15ULL + i) % 20;

	if (h < 3)
		return 0;	/* zero 15% */
	if (h < 5)
		return 1;	/* same 10% */
	if (h < 10)
		return 2;	/* text 25% */
	if (h < 13)
		return 3;	/* random 15% */
	if (h < 17)
		return 4;	/* neardup 20% */
	return 5;		/* heap 15% */
}

static const char *words[] = {
	"sandbox ", "template ", "tool_call ", "llm_wait ", "tensor ",
	"gradient ", "optimizer ", "{\"role\": ", "\"assistant\", ", "0.000 ",
	"def forward(self, x): ", "return ", "import numpy as np\n", "loss=",
};

static void gen_base(uint64_t seed, uint64_t b, uint64_t *w)
{
	uint64_t x = mix(seed ^ (b + 0x1234));
	int k;

	for (k = 0; k < WORDS; k++) {
		x = mix(x + k);
		/* Half small values, half random: compresses a little. */
		w[k] = (k & 1) ? x : (x & 0xffff);
	}
}

static void gen_page(uint64_t seed, uint64_t i, uint64_t *w)
{
	uint64_t x = mix(seed ^ mix(i + 1));
	char *c = (char *)w;
	int k, pos, kind = az_kind(seed, i);

	switch (kind) {
	case 0:
		memset(w, 0, PG);
		return;
	case 1:
		x |= 1;
		for (k = 0; k < WORDS; k++)
			w[k] = x;
		return;
	case 2:
		pos = 0;
		while (pos < PG) {
			const char *s = words[(x >> 8) % (sizeof(words) / sizeof(words[0]))];
			int n = strlen(s);

			x = mix(x);
			if (pos + n > PG)
				n = PG - pos;
			memcpy(c + pos, s, n);
			pos += n;
			if (pos < PG - 8 && !(x & 7)) {
				c[pos++] = '0' + (i % 10);
				c[pos++] = '0' + (x >> 20) % 10;
			}
		}
		break;
	case 3:
		for (k = 0; k < WORDS; k++) {
			x = mix(x + k);
			w[k] = x;
		}
		break;
	case 4:
		gen_base(seed, i % 16, w);
		for (k = 0; k < 6; k++) {
			x = mix(x + k);
			w[4 + x % (WORDS - 4)] ^= x | 1;
		}
		break;
	case 5:
		for (k = 0; k < WORDS; k++) {
			x = mix(x + k);
			w[k] = (k % 3 == 0) ? 0x7f0000000000ULL + ((x & 0xffff) << 4) :
			       (k % 3 == 1) ? (x & 0xff) : 0;
		}
		break;
	}
	w[0] = 0x617a70616765ULL;	/* "azpage" */
	w[1] = seed;
	w[2] = i;
	w[3] = 0;
}

/* Words a variant changes in page i (none for most pages). */
static int variant_edits(uint64_t seed, uint64_t i, uint64_t v, uint64_t every,
			 int *idx, uint64_t *val)
{
	uint64_t x;
	int k, n;

	if (!v || !every || i % every != v % every)
		return 0;
	x = mix(seed ^ mix(i * 31 + v));
	n = 1 + x % 4;
	for (k = 0; k < n; k++) {
		x = mix(x + k);
		idx[k] = 4 + x % (WORDS - 4);
		val[k] = x ^ v;
	}
	return n;
}

static void expected(uint64_t seed, uint64_t i, uint64_t v, uint64_t every,
		     uint64_t *w)
{
	uint64_t val[4];
	int idx[4], k, n;

	gen_page(seed, i, w);
	n = variant_edits(seed, i, v, every, idx, val);
	for (k = 0; k < n; k++)
		w[idx[k]] = val[k];
	if (n)
		w[3] = v;
}

void az_fill(void *buf, uint64_t npages, uint64_t seed)
{
	uint64_t i;

	for (i = 0; i < npages; i++)
		gen_page(seed, i, (uint64_t *)((char *)buf + i * PG));
}

/* Apply variant @v's edits: only the words it changes are written. */
void az_edit(void *buf, uint64_t npages, uint64_t seed, uint64_t v,
	     uint64_t every)
{
	uint64_t i, val[4];
	int idx[4], k, n;

	for (i = 0; i < npages; i++) {
		uint64_t *w = (uint64_t *)((char *)buf + i * PG);

		n = variant_edits(seed, i, v, every, idx, val);
		for (k = 0; k < n; k++)
			w[idx[k]] = val[k];
		if (n)
			w[3] = v;
	}
}

/*
 * Compare every page with what it must hold.  Returns the number of bad
 * pages; *first gets the first bad page number (or ~0).
 */
uint64_t az_verify(const void *buf, uint64_t npages, uint64_t seed,
		   uint64_t v, uint64_t every, uint64_t *first)
{
	uint64_t w[WORDS], i, bad = 0;

	*first = ~0ULL;
	for (i = 0; i < npages; i++) {
		expected(seed, i, v, every, w);
		if (memcmp(w, (const char *)buf + i * PG, PG)) {
			if (!bad)
				*first = i;
			bad++;
		}
	}
	return bad;
}

/* Read one byte of every page (forces swap-in). */
uint64_t az_touch(const void *buf, uint64_t npages)
{
	const volatile char *c = buf;
	uint64_t i, s = 0;

	for (i = 0; i < npages; i++)
		s += c[i * PG + 100];
	return s;
}

/*
 * One read(2) or write(2) with the calling thread marked for fault
 * injection (/proc/thread-self/make-it-fail, opened by the caller on
 * @mark_fd): the fault-injection tests aim failslab and fail_page_alloc at
 * what the kernel allocates inside that system call only, with nothing
 * allocated here between the marks.  Returns the byte count or -errno.
 */
long az_marked_io(int mark_fd, int fd, void *buf, uint64_t len, int is_read)
{
	long r;
	int err;

	if (write(mark_fd, "1", 1) != 1)
		return -errno;
	r = is_read ? read(fd, buf, len) : write(fd, buf, len);
	err = errno;
	if (write(mark_fd, "0", 1) != 1)
		return -errno;
	return r < 0 ? -err : r;
}
