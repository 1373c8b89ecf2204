/* tool.h - what the parts of the `sdp` command share. */
#ifndef SDP_TOOLS_TOOL_H
#define SDP_TOOLS_TOOL_H

/* Print the usage and exit 2. */
__attribute__((noreturn)) void sdp_usage(void);
/* "sdp CMD: unknown option 'ARG'", the usage, exit 2. */
__attribute__((noreturn)) void sdp_bad_option(const char *cmd, const char *arg);

int sdp_cmd_stat(int argc, char **argv);     /* stat.c */

/* Buffer Copy between two CPUs of this process's set, now (xcopy.c):
 * end-to-end GB/s with plain and with streaming stores into the ring. */
struct sdp_cross_copy {
	int    cpu_a, cpu_b;           /* writer's and reader's CPU */
	double plain_gbps;
	double stream_gbps;
};
int sdp_cross_copy(struct sdp_cross_copy *o);  /* -1: fewer than 2 CPUs */

#endif
