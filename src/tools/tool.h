/* tool.h - what the parts of the `sdp` command share. */
#ifndef SDP_TOOLS_TOOL_H
#define SDP_TOOLS_TOOL_H

/* Print the usage and exit 2. */
__attribute__((noreturn)) void sdp_usage(void);
/* "sdp CMD: unknown option 'ARG'", the usage, exit 2. */
__attribute__((noreturn)) void sdp_bad_option(const char *cmd, const char *arg);

int sdp_cmd_stat(int argc, char **argv);     /* stat.c */

#endif
