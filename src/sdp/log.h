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
#define sdp_log(lvl, ...) \
	do { if ((lvl) <= sdp_log_level) sdp_logf(__VA_ARGS__); } while (0)

#endif
