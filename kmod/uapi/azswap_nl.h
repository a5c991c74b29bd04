/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * Generic netlink ABI of azswap.ko: family "azswap", version 1.
 * The contract is docs/netlink.md; this header is its C form.
 */
#ifndef _UAPI_AZSWAP_NL_H
#define _UAPI_AZSWAP_NL_H

#define AZSWAP_GENL_NAME	"azswap"
#define AZSWAP_GENL_VERSION	1
#define AZSWAP_MCGRP_EVENTS	"events"

/*
 * AZSWAP_A_PAGES carries 1..AZSWAP_LOAD_MAX_PAGES whole 4096-byte pages
 * (an attribute's length is 16 bits: 16 pages would not fit).
 */
#define AZSWAP_PAGE_SIZE	4096
#define AZSWAP_LOAD_MAX_PAGES	15

enum azswap_cmd {
	AZSWAP_CMD_UNSPEC,
	AZSWAP_CMD_GET_INFO,		/* 1 */
	AZSWAP_CMD_SANDBOX_ADD,		/* 2 */
	AZSWAP_CMD_SANDBOX_DEL,		/* 3 */
	AZSWAP_CMD_TEMPLATE_ADD,	/* 4 */
	AZSWAP_CMD_TEMPLATE_DEL,	/* 5 */
	AZSWAP_CMD_TEMPLATE_LOAD,	/* 6 */
	AZSWAP_CMD_STATS_GET,		/* 7 */
	AZSWAP_CMD_POLICY_GET,		/* 8 */
	AZSWAP_CMD_POLICY_SET,		/* 9 */
	AZSWAP_CMD_PHASE_SET,		/* 10 */
	AZSWAP_CMD_SANDBOX_MAP,		/* 11 */

	__AZSWAP_CMD_MAX,
	AZSWAP_CMD_MAX = __AZSWAP_CMD_MAX - 1
};

enum azswap_attr {
	AZSWAP_A_UNSPEC,
	AZSWAP_A_DEV = 1,			/* u32 */
	AZSWAP_A_CGROUP_ID = 2,			/* u64 */
	AZSWAP_A_CGROUP_PATH = 3,		/* string */
	AZSWAP_A_GROUP = 4,			/* u32, 1..2^31-1 */
	AZSWAP_A_IS_TEMPLATE = 5,		/* u8 */
	AZSWAP_A_INDEX = 6,			/* u64 */
	AZSWAP_A_PAGES = 7,			/* binary, n * 4096 */
	AZSWAP_A_PHASE = 8,			/* u8, enum azswap_phase */
	AZSWAP_A_VERSION = 9,			/* u32 */
	AZSWAP_A_NR_DEVICES = 10,		/* u32 */
	AZSWAP_A_OWNER = 11,			/* nested (reserved) */
	AZSWAP_A_POLICY_CODEC = 12,		/* u32, 0 lz4, 1 zstd */
	AZSWAP_A_POLICY_LEVEL = 13,		/* u32, 1..9 */
	AZSWAP_A_POLICY_DEDUP = 14,		/* u8 */
	AZSWAP_A_POLICY_TDELTA = 15,		/* u8 */
	AZSWAP_A_POLICY_XDELTA = 16,		/* u8 */
	AZSWAP_A_POLICY_SIM_EFFORT = 17,	/* u32, 0..64 */
	AZSWAP_A_POLICY_DELTA_MAX_PCT = 18,	/* u32, 1..100 */
	AZSWAP_A_POLICY_SHUFFLE = 19,		/* u8 */
	AZSWAP_A_ST_PAGES = 20,			/* u64 */
	AZSWAP_A_ST_ORIG_BYTES = 21,		/* u64 */
	AZSWAP_A_ST_EXCLUSIVE_BYTES = 22,	/* u64 */
	AZSWAP_A_ST_SHARED_BYTES = 23,		/* u64 */
	AZSWAP_A_ST_SAME = 24,			/* u64 */
	AZSWAP_A_ST_DUP = 25,			/* u64 */
	AZSWAP_A_ST_TDELTA = 26,		/* u64 */
	AZSWAP_A_ST_XDELTA = 27,		/* u64 */
	AZSWAP_A_ST_PLAIN = 28,			/* u64 */
	AZSWAP_A_ST_RAW = 29,			/* u64 */
	AZSWAP_A_ST_PHASE = 30,			/* u8 */
	AZSWAP_A_ST_REGISTERED = 31,		/* u8, 0 = removed, still owns bytes */
	AZSWAP_A_MAP_START = 32,		/* u64, virtual page number */
	AZSWAP_A_MAP_PAGES = 33,		/* u64, 0 = no map */
	AZSWAP_A_COW_INDEX = 34,		/* u8, enum azswap_cow_index */

	__AZSWAP_A_MAX,
	AZSWAP_A_MAX = __AZSWAP_A_MAX - 1
};

enum azswap_phase {
	AZSWAP_PHASE_UNKNOWN = 0,
	AZSWAP_PHASE_TOOL = 1,
	AZSWAP_PHASE_LLM_WAIT = 2,
	AZSWAP_PHASE_IDLE = 3,
	AZSWAP_PHASE_MAX = AZSWAP_PHASE_IDLE
};

/*
 * How the running kernel indexes a copied-on-write page of a private file
 * mapping when it reaches swap: by its file page offset (up to 6.x), or by
 * its virtual page number (7.x).  With the latter, SANDBOX_MAP tells the
 * module where a sandbox maps a snapshot template.
 */
enum azswap_cow_index {
	AZSWAP_COW_INDEX_FILE = 0,
	AZSWAP_COW_INDEX_VIRTUAL = 1,
};

#endif /* _UAPI_AZSWAP_NL_H */
