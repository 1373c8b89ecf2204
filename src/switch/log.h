/* log.h - diagnostics on stderr, controlled by SDP_LOG=0..3 (default 0:
 * only policy errors and warnings that lose function are printed). */
#ifndef SDP_SWITCH_LOG_H
#define SDP_SWITCH_LOG_H

extern int sdp_log_level;
void sdp_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define sdp_log(lvl, ...) \
	do { if ((lvl) <= sdp_log_level) sdp_logf(__VA_ARGS__); } while (0)

#endif
