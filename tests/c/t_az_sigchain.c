/*
 * Asynchronous zero copy protects pages with mprotect (SDP_AZ_PROTECT=
 * mprotect here), so SIGSEGV passes through the library first. The
 * application must not notice: while its own sends' pages fault (the
 * library's faults, taken and resolved behind its back), a fault that is
 * its own - a write to a page it made read-only - reaches its handler
 * exactly as without the library: with its si_addr and si_code, on its
 * sigaltstack when SA_ONSTACK asks, SIGSEGV blocked inside unless
 * SA_NODEFER, the action reset to SIG_DFL by SA_RESETHAND; sigaction and
 * signal report its own actions, installed before the first send or after
 * it; SIGSEGV sent with kill() is delivered or ignored as it says; and with
 * no handler (or SIG_IGN) its own fault kills it with SIGSEGV. Under kernel
 * TCP the same program checks the kernel's behaviour.
 */
#include "azlib.h"
#include <setjmp.h>

static int c = -1;                 /* the connection, sending */
static uint8_t *buf;               /* sent asynchronously, written at once */
static uint8_t *mine;              /* the application's own read-only page */

static volatile int hits;
static volatile uintptr_t hit_addr;
static volatile int hit_code;
static volatile int hit_blocked;   /* SIGSEGV blocked inside the handler */
static volatile uintptr_t hit_stack;
static volatile int hit_reset;     /* the action was SIG_DFL inside */

static void handler(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	int local;
	CHECK_EQ(sig, SIGSEGV);
	hits++;
	hit_addr = (uintptr_t)si->si_addr;
	hit_code = si->si_code;
	hit_stack = (uintptr_t)&local;
	sigset_t cur;
	sigprocmask(SIG_SETMASK, NULL, &cur);
	hit_blocked = sigismember(&cur, SIGSEGV);
	struct sigaction now;
	sigaction(SIGSEGV, NULL, &now);
	hit_reset = now.sa_handler == SIG_DFL;
	if (si->si_code > 0)             /* a fault: let the access through */
		mprotect(mine, 4096, PROT_READ | PROT_WRITE);
}

static void plain_handler(int sig)
{
	(void)sig;
	hits++;
	mprotect(mine, 4096, PROT_READ | PROT_WRITE);
}

/* One AZ round: send the buffer, write it at once (the library's fault). */
static void az_round(uint64_t r)
{
	az_fill(buf, MiB, r);
	tl_send_all(c, buf, MiB);
	buf[12345] ^= 1;                      /* in flight: the library's */
	buf[12345] ^= 1;
}

/* The application's own fault. */
static void own_fault(void)
{
	mprotect(mine, 4096, PROT_READ);
	hits = 0;
	__asm__ __volatile__("" ::: "memory");
	((volatile uint8_t *)mine)[100] = 7;  /* faults, handler lets it go on */
	__asm__ __volatile__("" ::: "memory");
	CHECK_EQ(mine[100], 7);
}

static void setup(void)
{
	int s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(c);
		uint8_t *r = az_buf(MiB, 0);
		for (;;) {
			ssize_t n = recv(s, r, MiB, 0);
			if (n <= 0)
				_exit(0);
		}
	}
	close(s);
	buf = az_buf(MiB, 0);
	mine = az_buf(4096, 0);
}

static void install(int flags, bool siginfo)
{
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	if (siginfo)
		sa.sa_sigaction = handler;
	else
		sa.sa_handler = plain_handler;
	sa.sa_flags = flags | (siginfo ? SA_SIGINFO : 0);
	sigemptyset(&sa.sa_mask);
	CHECK_EQ(sigaction(SIGSEGV, &sa, &old), 0);
	struct sigaction now;
	CHECK_EQ(sigaction(SIGSEGV, NULL, &now), 0);
	CHECK(siginfo ? now.sa_sigaction == handler : now.sa_handler == plain_handler,
	      "sigaction does not report the application's handler");
	CHECK_EQ(now.sa_flags & (SA_SIGINFO | SA_RESETHAND | SA_NODEFER | SA_ONSTACK),
		 sa.sa_flags & (SA_SIGINFO | SA_RESETHAND | SA_NODEFER | SA_ONSTACK));
}

static int scenario(const char *what)
{
	tl_watchdog(60);
	if (!strcmp(what, "before")) {
		install(0, true);
		setup();
	} else {
		setup();
		az_round(0);
		install(0, true);
	}
	for (uint64_t r = 1; r < 20; r++) {
		hits = 0;
		az_round(r);
		CHECK_EQ(hits, 0);            /* the library's faults stay its own */
	}
	if (!strcmp(what, "before") || !strcmp(what, "after")) {
		own_fault();
		CHECK_EQ(hits, 1);
		CHECK_EQ(hit_addr, (uintptr_t)mine + 100);
		CHECK_EQ(hit_code, SEGV_ACCERR);
		CHECK_EQ(hit_blocked, 1);
		CHECK_EQ(hit_reset, 0);
		/* signal() reports the previous action, the application's */
		sighandler_t prev = signal(SIGSEGV, plain_handler);
		CHECK(prev == (sighandler_t)(void *)handler, "signal() returned %p", (void *)prev);
		own_fault();
		CHECK_EQ(hits, 1);
		prev = signal(SIGSEGV, SIG_DFL);
		CHECK(prev == plain_handler);
		/* SIGSEGV from kill(): delivered to the handler, or ignored */
		install(0, true);
		hits = 0;
		kill(getpid(), SIGSEGV);
		CHECK_EQ(hits, 1);
		CHECK_EQ(hit_code, SI_USER);
		signal(SIGSEGV, SIG_IGN);
		kill(getpid(), SIGSEGV);
	} else if (!strcmp(what, "resethand")) {
		install(SA_RESETHAND, true);
		own_fault();
		CHECK_EQ(hits, 1);
		CHECK_EQ(hit_reset, 1);
		struct sigaction now;
		sigaction(SIGSEGV, NULL, &now);
		CHECK(now.sa_handler == SIG_DFL, "SA_RESETHAND did not reset the action");
	} else if (!strcmp(what, "nodefer")) {
		install(SA_NODEFER, true);
		own_fault();
		CHECK_EQ(hits, 1);
		CHECK_EQ(hit_blocked, 0);
	} else if (!strcmp(what, "altstack")) {
		static char alt[65536];
		stack_t st = { .ss_sp = alt, .ss_size = sizeof alt };
		CHECK_EQ(sigaltstack(&st, NULL), 0);
		install(SA_ONSTACK, true);
		own_fault();
		CHECK_EQ(hits, 1);
		CHECK(hit_stack >= (uintptr_t)alt && hit_stack < (uintptr_t)alt + sizeof alt,
		      "the handler did not run on the alternate stack");
		install(0, true);
		own_fault();
		CHECK(hit_stack < (uintptr_t)alt || hit_stack >= (uintptr_t)alt + sizeof alt,
		      "without SA_ONSTACK the handler ran on the alternate stack");
	} else if (!strcmp(what, "default") || !strcmp(what, "ignored")) {
		signal(SIGSEGV, !strcmp(what, "ignored") ? SIG_IGN : SIG_DFL);
		az_round(99);
		mprotect(mine, 4096, PROT_READ);
		((volatile uint8_t *)mine)[1] = 1;   /* must kill us with SIGSEGV */
		fprintf(stderr, "survived a write to a read-only page\n");
		_exit(5);
	}
	az_round(100);
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv[2]);
	tl_watchdog(120);
	static const char *ok[] = { "before", "after", "resethand", "nodefer", "altstack" };
	const char *env[] = { "SDP_AZ_PROTECT=mprotect", "SDP_AZ_COOL=0", NULL };
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		const char *args[] = { ok[i], NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status 0x%x", ok[i], st);
	}
	static const char *die[] = { "default", "ignored" };
	for (size_t i = 0; i < 2; i++) {
		const char *args[] = { die[i], NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
		      "%s: its own fault did not kill it with SIGSEGV (status 0x%x)", die[i], st);
	}
	return 0;
}
