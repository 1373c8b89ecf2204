/*
 * azcal.c - measuring the two ways Asynchronous Zero Copy can protect a
 * buffer (az.h): mprotect, whose faults are SIGSEGV in the faulting thread
 * and whose protection the kernel's own accesses (read(2) into the buffer)
 * trip over with EFAULT; and userfaultfd write-protect, whose faults - the
 * kernel's accesses included - wait for a reader thread. Each process that
 * uses AZ measures once (a fraction of a millisecond, 64 pages); `sdp check`
 * runs the same with the faults timed too. Linked into libsdp and the tool.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/userfaultfd.h>

#include "sdp/az.h"
#include "sdp/calib.h"
#include "sdp/sys.h"
#include "sdp/tunables.h"

#define CAL_PAGES 64
#define CAL_ROUNDS 8

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int az_uffd_open(uint64_t *features)
{
	/* Without UFFD_USER_MODE_ONLY: the kernel's own accesses to a
	 * protected page must wait too (that is the point of it). An
	 * unprivileged process gets EPERM unless vm.unprivileged_userfaultfd
	 * is 1. */
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	struct uffdio_api api = {
		.api = UFFD_API,
		.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP | AZ_UFFD_WP_UNPOPULATED |
			    AZ_UFFD_POISON,
	};
	if (az_ioctl(fd, UFFDIO_API, &api) < 0) {
		/* An older kernel may refuse the newer features: ask again
		 * without them (a new descriptor: API is once). */
		int e = errno;
		sys_close(fd);
		if (e != EINVAL)
			return -e;
		fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
		if (fd < 0)
			return -errno;
		api.api = UFFD_API;
		api.features = UFFD_FEATURE_PAGEFAULT_FLAG_WP;
		if (az_ioctl(fd, UFFDIO_API, &api) < 0) {
			e = errno;
			sys_close(fd);
			return -e;
		}
	}
	if (!(api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
		sys_close(fd);
		return -EOPNOTSUPP;
	}
	if (features)
		*features = api.features;
	return fd;
}

static int uffd_wp(int fd, void *p, size_t len, bool on)
{
	struct uffdio_writeprotect wp = {
		.range = { (uintptr_t)p, len },
		.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};
	return az_ioctl(fd, UFFDIO_WRITEPROTECT, &wp);
}

/* ---- the cycle at a given size (calib.c: the `auto` AZ threshold) ------- */

double az_cycle_us(int mech, size_t len, int reps)
{
	len = (len + 4095) & ~(size_t)4095;
	char *p = az_mmap(len);
	if (p == MAP_FAILED)
		return -1;
	memset(p, 1, len);
	double best = -1;
	int fd = -1;
	if (mech == AZ_MECH_UFFD) {
		fd = az_uffd_open(NULL);
		struct uffdio_register reg = {
			.range = { (uintptr_t)p, len }, .mode = UFFDIO_REGISTER_MODE_WP,
		};
		if (fd < 0 || az_ioctl(fd, UFFDIO_REGISTER, &reg) < 0)
			goto out;
	}
	/* One cycle first: the first protection splits the mapping. */
	for (int r = -1; r < reps; r++) {
		double t = now_us();
		int bad;
		if (mech == AZ_MECH_UFFD)
			bad = uffd_wp(fd, p, len, true) | uffd_wp(fd, p, len, false);
		else
			bad = az_mprotect((uintptr_t)p, len, PROT_READ) |
			      az_mprotect((uintptr_t)p, len, PROT_READ | PROT_WRITE);
		t = now_us() - t;
		if (bad) {
			best = -1;
			break;
		}
		if (r >= 0 && (best < 0 || t < best))
			best = t;
	}
out:
	if (fd >= 0)
		sys_close(fd);
	az_munmap(p, len);
	return best;
}

/* ---- fault timing --------------------------------------------------------- */

static char *cal_page;
static volatile int cal_faults;
static int cal_uffd = -1;

static void cal_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if ((uintptr_t)si->si_addr - (uintptr_t)cal_page < 4096)
		az_mprotect((uintptr_t)cal_page, 4096, PROT_READ | PROT_WRITE);
	cal_faults++;
}

static void *cal_reader(void *arg)
{
	(void)arg;
	for (int served = 0; served < CAL_ROUNDS;) {
		struct pollfd p = { cal_uffd, POLLIN, 0 };
		if (sys_poll(&p, 1, 1000) <= 0)
			break;
		struct uffd_msg m;
		if (sys_read(cal_uffd, &m, sizeof m) != sizeof m)
			continue;
		if (m.event == UFFD_EVENT_PAGEFAULT) {
			uffd_wp(cal_uffd, cal_page, 4096, false);
			served++;
		}
	}
	return NULL;
}

/* The SIGSEGV round trip: only where nobody else handles SIGSEGV yet
 * (the tool, or a process before it installed anything). */
static void time_faults(struct az_calib *cal)
{
	cal_page = az_mmap(4096);
	if (cal_page == MAP_FAILED)
		return;
	cal_page[0] = 1;
	struct sigaction sa = { .sa_sigaction = cal_segv, .sa_flags = SA_SIGINFO }, old;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &old) == 0) {
		double t = now_us();
		for (int i = 0; i < CAL_ROUNDS; i++) {
			az_mprotect((uintptr_t)cal_page, 4096, PROT_READ);
			((volatile char *)cal_page)[0] = 2;
		}
		cal->mprotect_fault_us = (now_us() - t) / CAL_ROUNDS;
		sigaction(SIGSEGV, &old, NULL);
	}
	if (cal->uffd_ok) {
		cal_uffd = az_uffd_open(NULL);
		struct uffdio_register reg = {
			.range = { (uintptr_t)cal_page, 4096 }, .mode = UFFDIO_REGISTER_MODE_WP,
		};
		pthread_t th;
		if (cal_uffd >= 0 && az_ioctl(cal_uffd, UFFDIO_REGISTER, &reg) == 0 &&
		    pthread_create(&th, NULL, cal_reader, NULL) == 0) {
			double t = now_us();
			for (int i = 0; i < CAL_ROUNDS; i++) {
				uffd_wp(cal_uffd, cal_page, 4096, true);
				((volatile char *)cal_page)[0] = 3;
			}
			cal->uffd_fault_us = (now_us() - t) / CAL_ROUNDS;
			pthread_join(th, NULL);
		}
		if (cal_uffd >= 0)
			sys_close(cal_uffd);
		cal_uffd = -1;
	}
	az_munmap(cal_page, 4096);
}

void az_calibrate(struct az_calib *cal, bool with_faults)
{
	memset(cal, 0, sizeof *cal);
	size_t len = CAL_PAGES * 4096;
	char *p = az_mmap(len);
	if (p == MAP_FAILED) {
		snprintf(cal->why, sizeof cal->why, "no memory to measure with");
		cal->choice = AZ_MECH_MPROTECT;
		return;
	}
	memset(p, 1, len);
	double t = now_us();
	for (int i = 0; i < CAL_ROUNDS; i++) {
		az_mprotect((uintptr_t)p, len, PROT_READ);
		az_mprotect((uintptr_t)p, len, PROT_READ | PROT_WRITE);
	}
	cal->mprotect_us = (now_us() - t) / CAL_ROUNDS;

	uint64_t feat = 0;
	int fd = az_uffd_open(&feat);
	if (fd < 0) {
		snprintf(cal->uffd_why, sizeof cal->uffd_why, "userfaultfd: %s%s",
			 strerror(-fd), fd == -EPERM ?
			 " (needs CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)" : "");
	} else {
		struct uffdio_register reg = {
			.range = { (uintptr_t)p, len }, .mode = UFFDIO_REGISTER_MODE_WP,
		};
		if (az_ioctl(fd, UFFDIO_REGISTER, &reg) < 0) {
			snprintf(cal->uffd_why, sizeof cal->uffd_why,
				 "UFFDIO_REGISTER write-protect: %s", strerror(errno));
		} else {
			t = now_us();
			int bad = 0;
			for (int i = 0; i < CAL_ROUNDS; i++)
				bad |= uffd_wp(fd, p, len, true) | uffd_wp(fd, p, len, false);
			cal->uffd_us = (now_us() - t) / CAL_ROUNDS;
			if (bad)
				snprintf(cal->uffd_why, sizeof cal->uffd_why,
					 "UFFDIO_WRITEPROTECT: %s", strerror(errno));
			else
				cal->uffd_ok = true;
		}
		sys_close(fd);
	}
	az_munmap(p, len);
	if (with_faults)
		time_faults(cal);

	/* Every AZ send pays one protect + unprotect cycle; a fault is paid
	 * only when the application touches a buffer still in flight. So the
	 * cycle decides. userfaultfd also lets the kernel's own accesses wait
	 * instead of failing with EFAULT: it is taken unless its cycle costs
	 * half as much again as mprotect's. */
	if (sdp_tun.az_protect == AZ_MECH_MPROTECT || !cal->uffd_ok) {
		cal->choice = AZ_MECH_MPROTECT;
		snprintf(cal->why, sizeof cal->why, "%s",
			 sdp_tun.az_protect == AZ_MECH_MPROTECT ? "SDP_AZ_PROTECT=mprotect" :
			 "userfaultfd write-protect unavailable");
	} else if (sdp_tun.az_protect == AZ_MECH_UFFD) {
		cal->choice = AZ_MECH_UFFD;
		snprintf(cal->why, sizeof cal->why, "SDP_AZ_PROTECT=uffd");
	} else if (cal->uffd_us > 1.5 * cal->mprotect_us) {
		cal->choice = AZ_MECH_MPROTECT;
		snprintf(cal->why, sizeof cal->why, "measured: mprotect cycle %.1f us, "
			 "userfaultfd %.1f us", cal->mprotect_us, cal->uffd_us);
	} else {
		cal->choice = AZ_MECH_UFFD;
		snprintf(cal->why, sizeof cal->why, "measured: userfaultfd cycle %.1f us, "
			 "mprotect %.1f us; kernel accesses wait", cal->uffd_us,
			 cal->mprotect_us);
	}
}
