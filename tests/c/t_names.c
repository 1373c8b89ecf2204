/*
 * Isolation by name: while a connection between two processes is up and
 * carrying data, nothing it uses can be found by name in /dev/shm or /tmp:
 * no open file or mapping of either process under those directories still
 * has a name there, no unix socket of theirs is bound to a path there, and
 * /dev/shm has no new entry.
 */
#include "testlib.h"
#include <dirent.h>
#include <sys/stat.h>

#define SEED 5

static int in_dirs(const char *path)
{
	return strncmp(path, "/dev/shm/", 9) == 0 ||
	       strncmp(path, "/tmp/", 5) == 0;
}

static char self_exe[4096];

/* A path still reachable by name (not deleted). Program code (this test's
 * own executable, shared libraries) is not connection state. */
static int named(const char *path)
{
	char p[4096];
	size_t len = strlen(path);
	if (strcmp(path, self_exe) == 0 ||
	    (len > 3 && strcmp(path + len - 3, ".so") == 0))
		return 0;
	snprintf(p, sizeof p, "%s", path);
	char *del = strstr(p, " (deleted)");
	if (del)
		return 0;
	struct stat st;
	return stat(p, &st) == 0;
}

static int collect_socket_inodes(pid_t pid, unsigned long *ino, int max,
				 int *bad)
{
	char dir[64], link[4096], path[512];
	int n = 0;
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	CHECK(d != NULL, "%s", dir);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		ssize_t k = readlink(path, link, sizeof link - 1);
		if (k < 0)
			continue;
		link[k] = 0;
		if (sscanf(link, "socket:[%lu]", &ino[n]) == 1 && n < max)
			n++;
		else if (in_dirs(link) && named(link)) {
			fprintf(stderr, "pid %d fd %s -> %s is visible\n",
				(int)pid, e->d_name, link);
			(*bad)++;
		}
	}
	closedir(d);

	snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL);
	char line[4096];
	while (fgets(line, sizeof line, f)) {
		char *p = strchr(line, '/');
		if (!p)
			continue;
		p[strcspn(p, "\n")] = 0;
		if (in_dirs(p) && named(p)) {
			fprintf(stderr, "pid %d maps %s, visible\n", (int)pid,
				p);
			(*bad)++;
		}
	}
	fclose(f);
	return n;
}

static int check_unix(unsigned long *ino, int n)
{
	FILE *f = fopen("/proc/net/unix", "r");
	if (!f)
		return 0;
	char line[4096];
	int bad = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long inode;
		char path[4096] = "";
		if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %4095s", &inode,
			   path) < 1)
			continue;
		for (int i = 0; i < n; i++)
			if (ino[i] == inode && in_dirs(path)) {
				fprintf(stderr, "unix socket bound to %s\n",
					path);
				bad++;
			}
	}
	fclose(f);
	return bad;
}

static int list_dir(const char *dir, char names[][256], int max)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max)
		if (e->d_name[0] != '.' || (e->d_name[1] && e->d_name[1] != '.'))
			snprintf(names[n++], 256, "%s", e->d_name);
	closedir(d);
	return n;
}

int main(void)
{
	static char before[512][256], during[512][256];
	uint16_t port;
	int go[2], done[2];

	tl_watchdog(15);
	ssize_t k = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
	CHECK(k > 0);
	self_exe[k] = 0;
	int nb = list_dir("/dev/shm", before, 512);
	int l = tl_listen(AF_INET, &port);
	SYS(pipe(go));
	SYS(pipe(done));
	pid_t pid = tl_fork();
	if (pid == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		tl_send_pat(c, 0, 1u << 20, SEED, 65536);
		tl_recv_pat(c, 0, 1u << 20, SEED + 1, 65536);
		char b;
		CHECK_EQ(write(go[1], "g", 1), 1);
		CHECK_EQ(read(done[0], &b, 1), 1);	/* still connected */
		SYS(close(c));
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	tl_recv_pat(s, 0, 1u << 20, SEED, 65536);
	tl_send_pat(s, 0, 1u << 20, SEED + 1, 65536);
	char b;
	CHECK_EQ(read(go[0], &b, 1), 1);

	int bad = 0;
	unsigned long ino[512];
	int n = collect_socket_inodes(getpid(), ino, 256, &bad);
	n += collect_socket_inodes(pid, ino + n, 256, &bad);
	bad += check_unix(ino, n);
	int nd = list_dir("/dev/shm", during, 512);
	for (int i = 0; i < nd; i++) {
		int found = 0;
		for (int j = 0; j < nb && !found; j++)
			found = strcmp(during[i], before[j]) == 0;
		if (!found) {
			fprintf(stderr, "new in /dev/shm: %s\n", during[i]);
			bad++;
		}
	}
	CHECK_EQ(write(done[1], "d", 1), 1);
	tl_wait_ok(pid);
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	SYS(close(s));
	SYS(close(l));
	CHECK_EQ(bad, 0);
	return 0;
}
