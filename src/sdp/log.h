/*
 * log.h - the library's diagnostics on stderr, used by the engine and the
 * switch alike. SDP_LOG=0..3 sets the level (tunables.c; default 0: only
 * what loses function - policy errors, connections reset or kept on TCP
 * for a reason the library decided).
 */
#ifndef SDP_LOG_H
#define SDP_LOG_H

extern int sdp_log_level;
/* One line "sdp[PID]: ..." on stderr, written with one raw write(2). */
void sdp_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void sdp_log_at(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define sdp_log(lvl, ...) \
	do { if ((lvl) <= sdp_log_level) sdp_logf(__VA_ARGS__); } while (0)

/* Why the calling thread's last set-up step kept a socket on TCP. The code
 * that decides says it (sdp_why, only kept at SDP_LOG >= 2); the switch's
 * log line for the socket prints it (sdp_why_take: the reason, or NULL if
 * none was given since the last take, which clears it). */
void sdp_whyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define sdp_why(...) \
	do { if (sdp_log_level >= 2) sdp_whyf(__VA_ARGS__); } while (0)
const char *sdp_why_take(void);

#endif
