// SPDX-License-Identifier: GPL-2.0
/* Instantiates the tracepoints declared in azswap_trace.h. */
#include <linux/module.h>

#define CREATE_TRACE_POINTS
#include "azswap_trace.h"
