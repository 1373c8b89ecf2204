/*
 * seccomplib.h - building and installing seccomp filters in the C tests.
 *
 * A filter is a list of (system call, action) rules plus a default action,
 * compiled into classic BPF: wrong architecture -> kill, then one compare
 * per rule. It can be installed with prctl(PR_SET_SECCOMP), with the
 * seccomp(2) system call through glibc's syscall(), or with a raw system
 * call instruction that no LD_PRELOAD library can see (sc_install_raw:
 * how a program that makes its system calls directly, or a kernel that
 * lacks a call, looks to the library).
 */
#ifndef SDP_SECCOMPLIB_H
#define SDP_SECCOMPLIB_H

#include "testlib.h"
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#define SC_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define SC_ARCH AUDIT_ARCH_AARCH64
#endif

#define SC_MAX_RULES 48

struct sc_rule {
	int nr;
	uint32_t action;
};

struct sc_filter {
	struct sock_filter insn[4 + 2 * SC_MAX_RULES + 1];
	struct sock_fprog prog;
};

/* Skips the test where the architecture is not known here. */
static inline void sc_build(struct sc_filter *f, const struct sc_rule *r, int n,
			    uint32_t dflt)
{
#ifndef SC_ARCH
	(void)f; (void)r; (void)n; (void)dflt;
	SKIP("no seccomp filter template for this architecture");
#else
	CHECK(n <= SC_MAX_RULES);
	int k = 0;
	f->insn[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
				offsetof(struct seccomp_data, arch));
	f->insn[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SC_ARCH, 1, 0);
	f->insn[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	f->insn[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
				offsetof(struct seccomp_data, nr));
	for (int i = 0; i < n; i++) {
		f->insn[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
							    (uint32_t)r[i].nr, 0, 1);
		f->insn[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, r[i].action);
	}
	f->insn[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, dflt);
	f->prog.len = (unsigned short)k;
	f->prog.filter = f->insn;
#endif
}

static inline void sc_no_new_privs(void)
{
	SYS(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
}

/* The ordinary ways a program sandboxes itself. */
static inline void sc_install_prctl(struct sc_filter *f)
{
	sc_no_new_privs();
	SYS(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &f->prog));
}

static inline void sc_install_syscall(struct sc_filter *f)
{
	sc_no_new_privs();
	SYS(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &f->prog));
}

/* A system call instruction of our own: nothing interposed sees it. */
static inline long sc_raw3(long nr, long a, long b, long c)
{
#if defined(__x86_64__)
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c)
			 : "rcx", "r11", "memory");
	return ret;
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	__asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2) : "memory");
	return x0;
#else
	(void)nr; (void)a; (void)b; (void)c;
	SKIP("no raw system call template for this architecture");
	return -ENOSYS;
#endif
}

static inline void sc_install_raw(struct sc_filter *f)
{
	sc_no_new_privs();
	long r = sc_raw3(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, (long)&f->prog);
	CHECK(r == 0, "raw seccomp(SET_MODE_FILTER) returned %ld", r);
}

#endif
