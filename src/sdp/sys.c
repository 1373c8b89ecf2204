/*
 * sys.c - the one piece of state behind sys.h: which descriptors are the
 * library's own (sys_fd_keep / sys_fd_ours).
 */
#include "sdp/sys.h"

_Atomic unsigned long sys_fd_map[SYS_FDMAP_BITS / (8 * sizeof(unsigned long))];
