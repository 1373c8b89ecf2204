/*
 * process.c - exec: the new program may not run the switch, so every SDP
 * socket it inherits (not close-on-exec) leaves SDP for plain TCP first
 * (sdp/fallback.c), losing nothing. The same holds for programs started
 * without our exec: posix_spawn, posix_spawnp, system and popen (glibc
 * runs its own exec inside them), where a socket can also reach the
 * program through a posix_spawn dup2 file action. fork counts, before the
 * child exists, the child's share of each connection and listener (a parent
 * that closes its copy at once is then never taken for the last holder).
 * pthread_create notes that the process has threads (sdp/wake.c: a
 * shutdown in one then wakes the others' sleeps on the socket).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include <dlfcn.h>
#include <alloca.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>

#include "sdp/az.h"
#include "sdp/wake.h"
#include "switch/switch.h"

extern char **environ;

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execvpe_fn)(const char *, char *const[], char *const[]);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef int (*execveat_fn)(int, const char *, char *const[], char *const[], int);

static void *next(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

/* This image is replaced: what peers still have to read of its memory
 * (asynchronous zero copy) is read first; then the sockets leave SDP. A
 * vfork child shares its parent's memory, which stays. */
static void before_exec(void)
{
	if (!sdp_in_vfork_child())
		az_before_exec();
	fd_before_exec();
}

typedef int (*pthread_create_fn)(pthread_t *, const pthread_attr_t *,
				 void *(*)(void *), void *);

/* Nothing else: a thread may be made before the library's start-up, and
 * by code that must not wait for it. */
EXPORT int pthread_create(pthread_t *th, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg)
{
	static _Atomic(pthread_create_fn) real;
	pthread_create_fn f = atomic_load_explicit(&real, memory_order_relaxed);
	if (!f) {
		f = (pthread_create_fn)next("pthread_create");
		if (!f)
			return EAGAIN;
		atomic_store(&real, f);
	}
	sdp_wake_threads();
	return f(th, attr, fn, arg);
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	SDP_INIT();
	before_exec();
	return ((execve_fn)next("execve"))(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	SDP_INIT();
	before_exec();
	return ((execvpe_fn)next("execvpe"))(file, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	SDP_INIT();
	before_exec();
	return ((fexecve_fn)next("fexecve"))(fd, argv, envp);
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[],
		    char *const envp[], int flags)
{
	SDP_INIT();
	before_exec();
	return ((execveat_fn)next("execveat"))(dirfd, path, argv, envp, flags);
}

EXPORT pid_t fork(void)
{
	SDP_INIT();
	fd_fork_prepare();
	/* After fd_fork_prepare (its hand-backs may take a set's lock), and
	 * before the pthread_atfork handlers take the locks that come after
	 * a set's (epoll.c). */
	epoll_fork_prepare();
	pid_t pid = real_fork();
	if (pid != 0)
		epoll_fork_parent();      /* the child's: epoll_fork_child */
	if (pid < 0)
		fd_fork_failed();
	return pid;
}

/* execl* take their arguments inline: collect them into an argv. */
#define COLLECT(arg0, ap, argv, extra)                                     \
	do {                                                               \
		size_t n_ = 1;                                             \
		va_list c_;                                                \
		va_copy(c_, ap);                                           \
		while (va_arg(c_, char *))                                 \
			n_++;                                              \
		va_end(c_);                                                \
		argv = alloca((n_ + 1) * sizeof(char *));                  \
		argv[0] = (char *)(arg0);                                  \
		for (size_t i_ = 1; i_ <= n_; i_++)                        \
			argv[i_] = va_arg(ap, char *);                     \
		extra;                                                     \
	} while (0)

EXPORT int execl(const char *path, const char *arg, ...)
{
	char **argv;
	va_list ap;
	va_start(ap, arg);
	COLLECT(arg, ap, argv, (void)0);
	va_end(ap);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	char **argv;
	va_list ap;
	va_start(ap, arg);
	COLLECT(arg, ap, argv, (void)0);
	va_end(ap);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	char **argv;
	char **envp;
	va_list ap;
	va_start(ap, arg);
	COLLECT(arg, ap, argv, envp = va_arg(ap, char **));
	va_end(ap);
	return execve(path, argv, envp);
}

/* ---- programs started without our exec ------------------------------------- */

/* dup2 file actions recorded per posix_spawn_file_actions_t: their source
 * descriptors reach the new program whatever their close-on-exec flag. */
#define SPAWN_DUPS 64
static struct { const void *fa; int fd; } spawn_dups[SPAWN_DUPS];
static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;

/* The child of a fork (config.c's pthread_atfork handler): another thread
 * may have held the lock; an entry half written names a file action the
 * child's next init or destroy forgets anyway. */
void spawn_fork_child(void)
{
	pthread_mutex_init(&spawn_lock, NULL);
}

static void dups_forget(const void *fa)
{
	for (int i = 0; i < SPAWN_DUPS; i++)
		if (spawn_dups[i].fa == fa)
			spawn_dups[i].fa = NULL;
}

typedef int (*fa_init_fn)(posix_spawn_file_actions_t *);
typedef int (*fa_dup2_fn)(posix_spawn_file_actions_t *, int, int);
typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
			const posix_spawnattr_t *, char *const[], char *const[]);
typedef int (*system_fn)(const char *);
typedef FILE *(*popen_fn)(const char *, const char *);

EXPORT int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa)
{
	pthread_mutex_lock(&spawn_lock);
	dups_forget(fa);                  /* the address may be reused */
	pthread_mutex_unlock(&spawn_lock);
	return ((fa_init_fn)next("posix_spawn_file_actions_init"))(fa);
}

EXPORT int posix_spawn_file_actions_destroy(posix_spawn_file_actions_t *fa)
{
	pthread_mutex_lock(&spawn_lock);
	dups_forget(fa);
	pthread_mutex_unlock(&spawn_lock);
	return ((fa_init_fn)next("posix_spawn_file_actions_destroy"))(fa);
}

EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa,
					    int fd, int newfd)
{
	int r = ((fa_dup2_fn)next("posix_spawn_file_actions_adddup2"))(fa, fd, newfd);
	if (r == 0) {
		pthread_mutex_lock(&spawn_lock);
		int i = 0;
		while (i < SPAWN_DUPS && spawn_dups[i].fa)
			i++;
		if (i < SPAWN_DUPS) {
			spawn_dups[i].fa = fa;
			spawn_dups[i].fd = fd;
		} else {
			sdp_log(0, "posix_spawn: too many dup2 file actions to follow; "
				"fd %d may reach the new program on SDP", fd);
		}
		pthread_mutex_unlock(&spawn_lock);
	}
	return r;
}

static void before_spawn(const posix_spawn_file_actions_t *fa)
{
	int extra[SPAWN_DUPS], n = 0;
	if (fa) {
		pthread_mutex_lock(&spawn_lock);
		for (int i = 0; i < SPAWN_DUPS; i++)
			if (spawn_dups[i].fa == fa)
				extra[n++] = spawn_dups[i].fd;
		pthread_mutex_unlock(&spawn_lock);
	}
	fd_before_exec_with(extra, n);
}

EXPORT int posix_spawn(pid_t *pid, const char *path,
		       const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[],
		       char *const envp[])
{
	SDP_INIT();
	before_spawn(fa);
	return ((spawn_fn)next("posix_spawn"))(pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file,
			const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[],
			char *const envp[])
{
	SDP_INIT();
	before_spawn(fa);
	return ((spawn_fn)next("posix_spawnp"))(pid, file, fa, attr, argv, envp);
}

EXPORT int system(const char *cmd)
{
	SDP_INIT();
	if (cmd)
		fd_before_exec();
	return ((system_fn)next("system"))(cmd);
}

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	SDP_INIT();
	fd_before_exec();
	return ((popen_fn)next("popen"))(cmd, mode);
}
