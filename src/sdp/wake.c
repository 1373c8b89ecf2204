/*
 * wake.c - the process's wake descriptor: how shutdown(SHUT_RD) in one
 * thread wakes the threads of this process asleep on the socket in the
 * kernel.
 *
 * TCP's shutdown(SHUT_RD) ends a recv() blocked in another thread and
 * makes a sleeping poll/select/epoll_wait report POLLIN|POLLRDHUP. Our
 * sleepers sleep on the connection's TCP socket, which stays open for
 * reading (the sends' credit waits need the peer's tokens on it), so the
 * shutdown cannot wake them there. Each sleep of a process that has more
 * than one thread therefore also watches an eventfd of ours, and a local
 * shutdown that finds a sleep holding it writes it.
 *
 * An eventfd stays readable once written; reading it back would race with
 * sleeps about to start. So a written one is retired instead: the next
 * sleep takes (or makes) another, and a retired one is read back and used
 * again only when no sleep holds it any more. The one sleeps take now is
 * never readable, and a shutdown that finds no sleep holding it has
 * nothing to wake (a sleep takes its hold before its last look at the
 * connection, the shutdown sets rx_shut before it looks at the holds).
 * epoll sets register each descriptor edge-triggered (epoll.c): a write
 * is one event, whatever the descriptor's count.
 *
 * Single-threaded processes never make one: their receiving watcher keeps
 * the kernel's own blocking recv(MSG_PEEK) (wait.c). A process counts as
 * threaded after its first pthread_create (the switch), or when a sleep
 * or a shutdown runs on a thread other than the main one. Without an
 * eventfd (seccomp, the descriptor limit) sleeps are as before: a shutdown
 * wakes them only at the peer's next wake-up, and the log says why.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>

#include "sdp/conn.h"
#include "sdp/log.h"
#include "sdp/sys.h"
#include "sdp/wake.h"

/* Changed under mu only. Atomic all the same: ThreadSanitizer does not
 * see a lock taken inside the poll() it intercepts (a blocking call), and
 * would report the accesses. */
static struct {
	_Atomic int fd1;              /* eventfd (high number) + 1, 0: none yet */
	_Atomic uint32_t refs;        /* sleeps that watch it now */
	_Atomic uint32_t id;          /* made-at count: epoll sets register by it */
} slot[SDP_WAKE_SLOTS];
static _Atomic int cur = -1;          /* the slot sleeps take, -1: take one */
static _Atomic uint32_t ids;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* 0: one thread so far, 1: threaded (sleeps watch a descriptor), 2: no
 * descriptor to be had (the log said why) */
static _Atomic int state;
static _Thread_local int main_thread;  /* 0 unknown, 1 yes, 2 no */

void sdp_wake_threads(void)
{
	int z = 0;
	atomic_compare_exchange_strong(&state, &z, 1);
}

/* Is this process threaded, as far as we know? Notes a sleep or shutdown
 * on a thread other than the main one. */
static int threaded(void)
{
	int s = atomic_load_explicit(&state, memory_order_relaxed);
	if (s != 0)
		return s;
	if (!main_thread)
		main_thread = (pid_t)syscall(SYS_gettid) == sdp_pid ? 1 : 2;
	if (main_thread == 1)
		return 0;
	sdp_wake_threads();
	return atomic_load(&state);
}

bool sdp_wake_threaded(void)
{
	return threaded() != 0;
}

static void give_up(const char *why, int err)
{
	if (atomic_exchange(&state, 2) != 2)
		sdp_log(1, "no wake descriptor (%s%s%s): shutdown(SHUT_RD) wakes a thread "
			"asleep on the socket only at the peer's next wake-up", why,
			err ? ": " : "", err ? strerror(err) : "");
}

int sdp_wake_hold(int *fd, uint32_t *id)
{
	if (threaded() != 1)
		return -1;
	pthread_mutex_lock(&mu);
	if (cur < 0) {
		/* A slot no sleep holds: the one free, or a retired one
		 * whose count is read back now. */
		for (int i = 0; i < SDP_WAKE_SLOTS && cur < 0; i++) {
			if (slot[i].refs)
				continue;
			if (!slot[i].fd1) {
				int e = sys_fd_keep((int)syscall(SYS_eventfd2, 0,
								 EFD_NONBLOCK | EFD_CLOEXEC), -1);
				if (e < 0) {
					int err = errno;
					pthread_mutex_unlock(&mu);
					give_up("eventfd", err);
					return -1;
				}
				slot[i].fd1 = e + 1;
				slot[i].id = ++ids;
			} else {
				uint64_t v;
				if (sys_read(slot[i].fd1 - 1, &v, sizeof v) < 0 &&
				    errno != EAGAIN) {
					int err = errno;
					pthread_mutex_unlock(&mu);
					give_up("its read", err);
					return -1;
				}
			}
			cur = i;
		}
		if (cur < 0) {
			/* Every slot held by a sleep not yet back (each was
			 * woken: they come back soon): this sleep goes
			 * without, as before. */
			pthread_mutex_unlock(&mu);
			return -1;
		}
	}
	int i = cur;
	slot[i].refs++;
	*fd = slot[i].fd1 - 1;
	if (id)
		*id = slot[i].id;
	pthread_mutex_unlock(&mu);
	return i;
}

void sdp_wake_drop(int i)
{
	if (i < 0 || i >= SDP_WAKE_SLOTS)
		return;
	pthread_mutex_lock(&mu);
	if (slot[i].refs)
		slot[i].refs--;
	pthread_mutex_unlock(&mu);
}

bool sdp_wake_all(struct sdp_conn *c)
{
	int was = atomic_load(&state);
	int s = threaded();                   /* (this thread may be the news) */
	if (was == 0) {
		/* One thread as far as we know: a sleep on this connection
		 * now is another process's (fork), a signal handler's
		 * caller, or a thread we did not see start. It wakes at the
		 * peer's next wake-up; our sleeps from now on watch a
		 * descriptor. */
		if (atomic_load(&c->nwaiters)) {
			sdp_log(1, "shutdown(SHUT_RD) found a sleep on the socket it cannot "
				"wake (another process's, a signal handler's caller, or a "
				"thread started without pthread_create): it wakes at the "
				"peer's next wake-up");
			sdp_wake_threads();
		}
		return false;
	}
	if (s != 1)
		return false;
	bool woke = false;
	pthread_mutex_lock(&mu);
	if (cur >= 0 && slot[cur].refs) {
		uint64_t one = 1;
		woke = sys_fd_ours(slot[cur].fd1 - 1) &&
		       sys_write(slot[cur].fd1 - 1, &one, sizeof one) == sizeof one;
		cur = -1;                     /* retired: readable until read back */
	}
	pthread_mutex_unlock(&mu);
	return woke;
}

void sdp_wake_woke(int i, short revents)
{
	if (i < 0 || i >= SDP_WAKE_SLOTS || !revents)
		return;
	/* Only a shutdown writes one, and it retires it at once: the one
	 * sleeps take still answering means the application closed our
	 * number (closefrom, close_range) - POLLNVAL, or another file
	 * there now, which would end every sleep at once. Never again. */
	pthread_mutex_lock(&mu);
	bool bad = (revents & POLLNVAL) || i == cur;
	int fd = slot[i].fd1 - 1;
	pthread_mutex_unlock(&mu);
	if (bad) {
		char why[64];
		snprintf(why, sizeof why, "descriptor %d closed by the application", fd);
		give_up(why, 0);
	}
}

void sdp_wake_atfork_child(void)
{
	/* The parent's descriptors are shared with it: a write of ours would
	 * wake its sleeps (and leave its current one readable). Ours anew,
	 * from one thread. */
	pthread_mutex_init(&mu, NULL);
	for (int i = 0; i < SDP_WAKE_SLOTS; i++) {
		if (slot[i].fd1)
			sys_close_kept(slot[i].fd1 - 1);
		slot[i].fd1 = 0;
		slot[i].refs = 0;
	}
	cur = -1;
	main_thread = 1;
	int s = 1;
	atomic_compare_exchange_strong(&state, &s, 0);
}
