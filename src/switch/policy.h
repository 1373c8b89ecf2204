/*
 * policy.h - the socket switch's policy: which stream sockets use SDP.
 *
 * File format (modelled on libsdp.conf), one rule per line, '#' comments:
 *
 *   use sdp|tcp|both  server|client|*  PROGRAM-GLOB  ADDR[/PREFIX]|*:PORT[-PORT]|*
 *
 * IPv6 addresses are written in brackets: [::1]:80, [fe80::/10]:1000-2000.
 * First matching rule wins. A server rule matches the address the socket
 * listens on; a client rule matches the address it connects to.
 *
 *   set NAME VALUE      tunables (spin_us, zcopy_thresh, ...), last one wins
 *
 * A bad line is reported once as "FILE:LINE: reason" and ignored.
 */
#ifndef SDP_SWITCH_POLICY_H
#define SDP_SWITCH_POLICY_H

#include <sys/socket.h>
#include <stdint.h>

enum sdp_use {
	SDP_USE_TCP  = 0,   /* plain kernel TCP */
	SDP_USE_SDP  = 1,   /* SDP (falls back to TCP when the peer is not SDP) */
	SDP_USE_BOTH = 2,   /* SDP when the peer supports it, else TCP */
};

enum sdp_role {
	SDP_ROLE_SERVER = 1,  /* listening / accepted sockets */
	SDP_ROLE_CLIENT = 2,  /* connecting sockets */
};

struct sdp_policy;

/* Reporter for bad lines: msg is "FILE:LINE: reason" without newline. */
typedef void (*sdp_policy_err_fn)(const char *msg, void *arg);

/* Parse policy text. Bad lines are reported through err (may be NULL) and
 * skipped. Returns NULL only when out of memory. */
struct sdp_policy *sdp_policy_parse(const char *text, const char *fname,
				    sdp_policy_err_fn err, void *arg);

/* Read and parse a file. Returns NULL with a negative code in *error if
 * the file cannot be used (sdp_policy_strerror says why): -errno, or
 * SDP_POLICY_ENOTREG and below for a file that is not a regular file (a
 * FIFO, a device: never read, so never waited on), -EFBIG above 16 MiB. */
struct sdp_policy *sdp_policy_load(const char *path, sdp_policy_err_fn err,
				   void *arg, int *error);

#define SDP_POLICY_ENOTREG  (-4096)

/* Text for an error of sdp_policy_load ("a FIFO, not a regular file"). */
const char *sdp_policy_strerror(int error);

/* Decide for one socket. prog is the program's short name; addr is the
 * listen address (server) or destination (client). With no matching rule
 * the answer is SDP_USE_TCP. */
enum sdp_use sdp_policy_match(const struct sdp_policy *p, enum sdp_role role,
			      const char *prog, const struct sockaddr *addr,
			      socklen_t addrlen);

/* The same, and the line of the matching rule in *line (0: none matched,
 * the answer is the default). */
enum sdp_use sdp_policy_lookup(const struct sdp_policy *p, enum sdp_role role,
			       const char *prog, const struct sockaddr *addr,
			       socklen_t addrlen, unsigned long *line);

/* A "set NAME VALUE" tunable: returns 0 and stores it, or -ENOENT. */
int sdp_policy_setting(const struct sdp_policy *p, const char *name,
		       const char **value);

/* The same, and the line that set it (the last "set" of that name). */
int sdp_policy_setting_at(const struct sdp_policy *p, const char *name,
			  const char **value, unsigned long *line);

/* The file name given when the policy was loaded or parsed ("policy"). */
const char *sdp_policy_file(const struct sdp_policy *p);

/* Number of rules (for tests and `sdp check`). */
int sdp_policy_nrules(const struct sdp_policy *p);

void sdp_policy_free(struct sdp_policy *p);

#endif
