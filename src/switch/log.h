/* log.h - diagnostics on stderr, controlled by SDP_LOG=0..3 (default 0:
 * only policy errors and warnings that lose function are printed). */
#ifndef SDP_SWITCH_LOG_H
#define SDP_SWITCH_LOG_H

extern int sdp_log_level;
void sdp_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
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
