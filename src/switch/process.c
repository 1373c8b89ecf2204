/*
 * process.c - exec: the new program may not run the switch, so every SDP
 * socket it inherits (not close-on-exec) leaves SDP for plain TCP first
 * (sdp/fallback.c), losing nothing. fork counts, before the child exists,
 * the child's share of each connection and listener (a parent that closes
 * its copy at once is then never taken for the last holder).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <unistd.h>
#include <dlfcn.h>
#include <alloca.h>

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

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	SDP_INIT();
	fd_before_exec();
	return ((execve_fn)next("execve"))(path, argv, envp);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	SDP_INIT();
	fd_before_exec();
	return ((execvpe_fn)next("execvpe"))(file, argv, envp);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	SDP_INIT();
	fd_before_exec();
	return ((fexecve_fn)next("fexecve"))(fd, argv, envp);
}

EXPORT int execveat(int dirfd, const char *path, char *const argv[],
		    char *const envp[], int flags)
{
	SDP_INIT();
	fd_before_exec();
	return ((execveat_fn)next("execveat"))(dirfd, path, argv, envp, flags);
}

EXPORT pid_t fork(void)
{
	SDP_INIT();
	fd_fork_prepare();
	pid_t pid = real_fork();
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
