// SPDX-License-Identifier: GPL-2.0
/*
 * player: turns recorded pages back into a live process (used by bench/swapbench.py).
 *
 *   player SOCKET NAME [CGROUP_DIR]
 *
 * Joins CGROUP_DIR (writes its pid to cgroup.procs), connects to the unix socket SOCKET, says
 * hello (u32 length + NAME) and then obeys commands from the driver (little endian):
 *
 *   'V' u64 start, u64 end, u64 pgoff, u32 prot, u32 len, path  map [start,end) at that address
 *        (MAP_FIXED_NOREPLACE): a private mapping of the file when path names one (so CoW pages
 *        carry the file offset as page->index), else anonymous memory (index = vaddr >> 12).
 *        Reply: i32 0 or -errno.
 *   'P' u64 vaddr, u32 n, then n pages        the pages are read from the socket straight into
 *        place (faulting them in, CoW in a forked child); remembered for 'S' and 'T'.
 *   'R'  reply u32 0, u64 pages written        (sync point)
 *   'S'  reply n u64 checksums of the pages written, in write order
 *   'T'  touch every written page in write order, timing the first access of each (the swap-in
 *        fault), then checksum them: reply u64 total ns, n u64 latencies (ns), n u64 checksums
 *   'F' u32 len name, u32 len cgroup dir       fork; the child joins the cgroup, connects as NAME
 *        and forgets the parent's page list; reply (parent) i32 child pid
 *   'K'  madvise(MADV_MERGEABLE) every mapping this process made with 'V' or inherited from the
 *        process that forked it (KSM may merge their pages); reply i32 0 or -errno
 *   'Q'  exit
 *
 * Checksum of a page: sum over its 512 little-endian u64 words w[i] of
 * w[i] * ((0x9E3779B97F4A7C15 * (i + 1)) | 1), mod 2^64 (odd multipliers: any single changed
 * word changes the sum). The driver computes the same from the trace.
 * Kept in C so the process holds nothing but the recorded pages (a few pages of its own).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#define PG 4096UL

struct run {
	uint64_t va;
	uint32_t n;
};

static int sock = -1;
static const char *sock_path;
static struct run *runs;
static size_t nruns, capruns;
static uint64_t npages;
/* the mappings made with 'V' (kept across fork: the child's inherited mappings) */
static struct run *maps;
static size_t nmaps, capmaps;

static void die(const char *what)
{
	fprintf(stderr, "player %d: %s: %s\n", getpid(), what, strerror(errno));
	_exit(2);
}

static void rd(void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t r = read(sock, p, len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				_exit(0);	/* driver went away */
			die("read");
		}
		p += r;
		len -= r;
	}
}

static void wr(const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t r = write(sock, p, len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			die("write");
		p += r;
		len -= r;
	}
}

static void join_cgroup(const char *dir)
{
	char path[4096], pid[32];
	int fd, n;

	if (!dir || !*dir)
		return;
	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		die(path);
	n = snprintf(pid, sizeof(pid), "%d", getpid());
	if (write(fd, pid, n) != n)
		die("cgroup.procs");
	close(fd);
}

static void connect_as(const char *name)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	uint32_t len = strlen(name);

	sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sock < 0)
		die("socket");
	strncpy(a.sun_path, sock_path, sizeof(a.sun_path) - 1);
	if (connect(sock, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("connect");
	wr(&len, 4);
	wr(name, len);
}

static uint64_t mults[512];

static uint64_t csum(const uint64_t *w)
{
	uint64_t s = 0;

	for (int i = 0; i < 512; i++)
		s += w[i] * mults[i];
	return s;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static char *rdstr(void)
{
	uint32_t len;
	char *s;

	rd(&len, 4);
	if (len > 4096) {
		errno = EINVAL;
		die("string too long");
	}
	s = calloc(1, len + 1);
	if (!s)
		die("calloc");
	rd(s, len);
	return s;
}

static void cmd_map(void)
{
	uint64_t start, end, pgoff;
	uint32_t prot;
	char *path;
	void *p = MAP_FAILED;
	int32_t ret = 0;
	int fd;

	rd(&start, 8);
	rd(&end, 8);
	rd(&pgoff, 8);
	rd(&prot, 4);
	path = rdstr();
	if (path[0] == '/') {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			p = mmap((void *)start, end - start, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, pgoff * PG);
			close(fd);
		}
	}
	if (p == MAP_FAILED)
		p = mmap((void *)start, end - start, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		ret = -errno;
	else if (p != (void *)start) {
		munmap(p, end - start);
		ret = -EEXIST;
	} else {
		madvise(p, end - start, MADV_NOHUGEPAGE);
		if (nmaps == capmaps) {
			capmaps = capmaps ? 2 * capmaps : 256;
			maps = realloc(maps, capmaps * sizeof(*maps));
			if (!maps)
				die("realloc");
		}
		maps[nmaps].va = start;
		maps[nmaps].n = (end - start) / PG;
		nmaps++;
	}
	free(path);
	wr(&ret, 4);
}

static void cmd_mergeable(void)
{
	int32_t ret = 0;

	for (size_t i = 0; i < nmaps && !ret; i++)
		if (madvise((void *)maps[i].va, (size_t)maps[i].n * PG, MADV_MERGEABLE))
			ret = -errno;
	wr(&ret, 4);
}

static void cmd_pages(void)
{
	uint64_t va;
	uint32_t n;

	rd(&va, 8);
	rd(&n, 4);
	rd((void *)va, (size_t)n * PG);
	if (nruns == capruns) {
		capruns = capruns ? 2 * capruns : 1024;
		runs = realloc(runs, capruns * sizeof(*runs));
		if (!runs)
			die("realloc");
	}
	runs[nruns].va = va;
	runs[nruns].n = n;
	nruns++;
	npages += n;
}

static void cmd_sums(void)
{
	uint64_t *out = malloc(npages * 8 + 8);
	size_t k = 0;

	for (size_t r = 0; r < nruns; r++)
		for (uint32_t i = 0; i < runs[r].n; i++)
			out[k++] = csum((const uint64_t *)(runs[r].va + i * PG));
	wr(out, npages * 8);
	free(out);
}

static void cmd_touch(void)
{
	uint64_t *lat = malloc(npages * 8 + 8), *sums = malloc(npages * 8 + 8);
	uint64_t t0, t1, total;
	size_t k = 0;

	if (!lat || !sums)
		die("malloc");
	total = now_ns();
	for (size_t r = 0; r < nruns; r++)
		for (uint32_t i = 0; i < runs[r].n; i++) {
			volatile const char *p = (const char *)(runs[r].va + i * PG);

			t0 = now_ns();
			(void)*p;
			t1 = now_ns();
			lat[k++] = t1 - t0;
		}
	total = now_ns() - total;
	k = 0;
	for (size_t r = 0; r < nruns; r++)
		for (uint32_t i = 0; i < runs[r].n; i++)
			sums[k++] = csum((const uint64_t *)(runs[r].va + i * PG));
	wr(&total, 8);
	wr(lat, npages * 8);
	wr(sums, npages * 8);
	free(lat);
	free(sums);
}

static void cmd_fork(void)
{
	char *name = rdstr(), *cg = rdstr();
	int32_t pid = fork();

	if (pid < 0)
		die("fork");
	if (pid == 0) {
		close(sock);
		join_cgroup(cg);
		nruns = 0;
		npages = 0;
		connect_as(name);
	} else {
		wr(&pid, 4);
	}
	free(name);
	free(cg);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: player SOCKET NAME [CGROUP_DIR]\n");
		return 2;
	}
	for (int i = 0; i < 512; i++)
		mults[i] = (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)) | 1;
	prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
	sock_path = argv[1];
	join_cgroup(argc > 3 ? argv[3] : NULL);
	connect_as(argv[2]);
	for (;;) {
		char c;
		uint32_t z = 0;

		rd(&c, 1);
		switch (c) {
		case 'V':
			cmd_map();
			break;
		case 'P':
			cmd_pages();
			break;
		case 'R':
			wr(&z, 4);
			wr(&npages, 8);
			break;
		case 'S':
			cmd_sums();
			break;
		case 'T':
			cmd_touch();
			break;
		case 'F':
			cmd_fork();
			break;
		case 'K':
			cmd_mergeable();
			break;
		case 'Q':
			return 0;
		default:
			errno = EINVAL;
			die("unknown command");
		}
	}
}
