// SPDX-License-Identifier: GPL-2.0
/*
 * Multi-threaded stress of the store core on the host (built with ASan or
 * TSan by host.mk: stress, stress-tsan).
 *
 *   azcore-stress THREADS SECONDS
 *
 * Each worker owns a disjoint range of slots (one writer per slot, as the
 * swap layer guarantees), stores related pages under sandboxes of two
 * trust groups, an unregistered cgroup and a template, reads them back and
 * frees them.  A control thread concurrently loads snapshot template
 * pages, removes and re-adds the template and a sandbox, changes non-codec
 * policy knobs, drains the deferred frees and reads stats.  Every read is
 * compared with the last page written; at the end the consistency checker
 * runs and everything must return to zero.
 */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "az_debug_host.h"

#define PER	256
#define NFAM	16
#define T1	1000
#define SA	11
#define SB	12
#define SC	21
#define UNREG	99

static struct az_store *store;
static u8 fam[NFAM][AZ_PAGE_SIZE];
static int stop;

#define STOPPED()	__atomic_load_n(&stop, __ATOMIC_ACQUIRE)
static int failures;

static u64 rnd(u64 *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void make_page(u8 *p, u64 *r, unsigned int f)
{
	unsigned int k, n;

	switch (rnd(r) % 8) {
	case 0:
		memset(p, 0, AZ_PAGE_SIZE);
		return;
	case 1:
		for (k = 0; k < AZ_PAGE_SIZE / 8; k++)
			((u64 *)p)[k] = rnd(r);
		return;
	default:
		memcpy(p, fam[f], AZ_PAGE_SIZE);
		n = rnd(r) % 12;
		for (k = 0; k < n; k++)
			((u64 *)p)[rnd(r) % (AZ_PAGE_SIZE / 8)] = rnd(r);
	}
}

static void fail(const char *what, u64 slot)
{
	fprintf(stderr, "stress: %s at slot %llu\n", what,
		(unsigned long long)slot);
	__atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);
}

static void *worker(void *arg)
{
	static const u64 owners[] = { SA, SB, SC, UNREG, 0, T1 };
	long id = (long)arg;
	struct az_ctx *ctx = az_ctx_create();
	u8 *model = calloc(PER, AZ_PAGE_SIZE), *buf = malloc(AZ_PAGE_SIZE);
	u64 r = 0x9e3779b97f4a7c15ULL * (id + 1), first = id * PER, i;

	if (!ctx || !model || !buf)
		abort();
	while (!STOPPED()) {
		u64 k = rnd(&r) % PER, slot = first + k;
		u8 *m = model + k * AZ_PAGE_SIZE;
		unsigned int f = rnd(&r) % NFAM;
		struct az_page_info pi = {
			.owner = owners[rnd(&r) % ARRAY_SIZE(owners)],
			.index = f,
		};
		int op = rnd(&r) % 10, err;

		if (op < 5) {
			make_page(buf, &r, f);
			err = az_store_put(store, ctx, slot, buf, &pi);
			if (err == -ENOMEM)
				memset(m, 0, AZ_PAGE_SIZE);
			else if (err)
				fail("put", slot);
			else
				memcpy(m, buf, AZ_PAGE_SIZE);
		} else if (op < 8) {
			if (az_store_get(store, ctx, slot, buf) ||
			    memcmp(buf, m, AZ_PAGE_SIZE))
				fail("get mismatch", slot);
		} else {
			az_store_free(store, slot);
			memset(m, 0, AZ_PAGE_SIZE);
		}
	}
	for (i = 0; i < PER; i++)
		if (az_store_get(store, ctx, first + i, buf) ||
		    memcmp(buf, model + i * AZ_PAGE_SIZE, AZ_PAGE_SIZE))
			fail("final get mismatch", first + i);
	free(buf);
	free(model);
	az_ctx_destroy(ctx);
	return NULL;
}

static void *control(void *arg)
{
	struct az_ctx *ctx = az_ctx_create();
	u8 *buf = malloc(AZ_PAGE_SIZE);
	struct az_policy pol;
	struct az_stats st;
	u64 r = 12345;
	bool treg = true, breg = true;
	int err;

	(void)arg;
	if (!ctx || !buf)
		abort();
	while (!STOPPED()) {
		switch (rnd(&r) % 6) {
		case 0:
			make_page(buf, &r, rnd(&r) % NFAM);
			err = treg ? az_store_template_load(store, ctx, T1,
							    rnd(&r) % NFAM,
							    buf) : 0;
			if (err && err != -ENOMEM)
				fail("template_load", 0);
			break;
		case 1:
			if (treg ? az_store_del_template(store, T1) :
				   az_store_add_template(store, T1, 1))
				fail("toggle template", 0);
			treg = !treg;
			break;
		case 2:
			if (breg ? az_store_del_sandbox(store, SB) :
				   az_store_add_sandbox(store, SB, 1))
				fail("toggle sandbox", 0);
			breg = !breg;
			break;
		case 3:
			az_store_get_policy(store, &pol);
			pol.dedup = rnd(&r) & 1;
			pol.xdelta = rnd(&r) & 1;
			pol.sim_effort = rnd(&r) % 8;
			if (az_store_set_policy(store, &pol))
				fail("set_policy", 0);
			break;
		case 4:
			az_store_drain(store);
			break;
		default:
			az_store_get_stats(store, &st);
			if (st.cross_group)
				fail("cross_group", 0);
			break;
		}
	}
	if (!treg && az_store_add_template(store, T1, 1))
		fail("re-add template", 0);
	free(buf);
	az_ctx_destroy(ctx);
	return NULL;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	int secs = argc > 2 ? atoi(argv[2]) : 5;
	pthread_t th[64], ctl;
	struct az_stats st;
	u64 r = 777, i;
	int t, k;

	if (nthreads < 1 || nthreads > 64)
		return 2;
	for (k = 0; k < NFAM; k++)
		for (i = 0; i < AZ_PAGE_SIZE / 8; i++)
			((u64 *)fam[k])[i] = (i % 3) ? rnd(&r) & 0xffff :
					     0x7f0000000000ULL + (rnd(&r) & 0xfff0);
	store = az_store_create((u64)nthreads * PER, "stress");
	if (!store || az_store_add_template(store, T1, 1) ||
	    az_store_add_sandbox(store, SA, 1) ||
	    az_store_add_sandbox(store, SB, 1) ||
	    az_store_add_sandbox(store, SC, 2))
		return 1;
	az_store_set_mem_limit(store, (u64)nthreads * PER * 1536);
	for (t = 0; t < nthreads; t++)
		pthread_create(&th[t], NULL, worker, (void *)(long)t);
	pthread_create(&ctl, NULL, control, NULL);
	sleep(secs);
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (t = 0; t < nthreads; t++)
		pthread_join(th[t], NULL);
	pthread_join(ctl, NULL);

	az_store_drain(store);
	if (az_store_debug_check(store))
		fail("consistency check", 0);
	az_store_get_stats(store, &st);
	printf("stress: %llu stores %llu loads %llu failed stores, kinds:",
	       (unsigned long long)st.stores, (unsigned long long)st.loads,
	       (unsigned long long)st.failed_stores);
	for (k = 0; k < AZ_NR_KINDS; k++)
		printf(" %s=%llu", az_kind_name(k),
		       (unsigned long long)st.kind_pages[k]);
	printf("\n");
	for (i = 0; i < (u64)nthreads * PER; i++)
		az_store_free(store, i);
	az_store_del_template(store, T1);
	az_store_drain(store);
	az_store_get_stats(store, &st);
	if (st.objects || st.pool_bytes || st.stored_bytes || st.bases ||
	    st.template_pages)
		fail("not empty after freeing everything", 0);
	az_store_destroy(store);
	if (failures)
		printf("stress: %d failures\n", failures);
	else
		printf("stress: ok\n");
	return failures ? 1 : 0;
}
