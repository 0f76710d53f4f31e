/* minirl's sandbox launcher: what `unshare ... sh -c 'mount ...' prlimit ... setpriv ... prog` does, in one
 * process instead of six (each exec of those tools costs ~2 ms, more than most tests). judge.py compiles it
 * once per machine and falls back to the util-linux chain when it cannot.
 *
 *   sandbox UID CPU_S AS_BYTES FSIZE_BYTES NPROC ISOLATE REPORT -- PROGRAM [ARGS...]
 *
 * ISOLATE=1: new mount, PID, network, IPC and UTS namespaces; /proc remounted (shows only the sandbox);
 * private tmpfs over /tmp, /var/tmp, /dev/shm. Then rlimits, drop to UID (no groups, no new privileges), exec.
 * The program runs as PID 2 under a minimal init (PID 1) so that its signals behave normally; when it ends,
 * init exits and the kernel kills whatever else is left in the namespace. Exit status: the program's, or
 * 128+signal if a signal ended it; 111 if the sandbox itself could not be set up. REPORT (a file, or "-")
 * receives "max_rss_kb user_s sys_s" of the program alone (the caller's own rusage would also count the
 * moments between its fork and our exec, when the child is a copy of a possibly large parent).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) { perror(what); _exit(111); }

static void limit(int resource, rlim_t value) {
    struct rlimit l = {value, value};
    if (setrlimit(resource, &l)) die("setrlimit");
}

static int wait_status(pid_t pid, FILE *report) {  /* exit code, or 128+signal */
    int st;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0)
        if (errno != EINTR) return 111;
    if (report) {
        fprintf(report, "%ld %ld.%06ld %ld.%06ld\n", ru.ru_maxrss, (long)ru.ru_utime.tv_sec,
                (long)ru.ru_utime.tv_usec, (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
        fclose(report);
    }
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

int main(int argc, char **argv) {
    if (argc < 10 || strcmp(argv[8], "--")) {
        fprintf(stderr, "usage: sandbox UID CPU_S AS_BYTES FSIZE_BYTES NPROC ISOLATE REPORT -- PROGRAM [ARGS...]\n");
        return 111;
    }
    uid_t uid = (uid_t)atol(argv[1]);
    rlim_t cpu = strtoull(argv[2], 0, 10), as = strtoull(argv[3], 0, 10), fsize = strtoull(argv[4], 0, 10);
    rlim_t nproc = strtoull(argv[5], 0, 10);
    int isolate = atoi(argv[6]);
    FILE *report = strcmp(argv[7], "-") ? fopen(argv[7], "w") : NULL;  /* opened before the mounts */
    char **program = argv + 9;
    limit(RLIMIT_CORE, 0);
    if (isolate && unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)) die("unshare");
    pid_t init = fork();
    if (init < 0) die("fork");
    if (init > 0) {
        if (report) fclose(report);
        return wait_status(init, NULL);
    }
    /* PID 1 of the new namespace */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (isolate) {
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("mount private");
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) die("mount proc");
        const char *dirs[] = {"/tmp", "/var/tmp", "/dev/shm"};
        for (int i = 0; i < 3; i++)
            if (mount("tmpfs", dirs[i], "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777") && errno != ENOENT)
                die("mount tmpfs");
    }
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child > 0) _exit(wait_status(child, report));
    if (report) fclose(report);
    /* the program */
    limit(RLIMIT_CPU, cpu);
    limit(RLIMIT_AS, as);
    limit(RLIMIT_STACK, as);
    limit(RLIMIT_FSIZE, fsize);
    limit(RLIMIT_NOFILE, 64);
    limit(RLIMIT_NPROC, nproc);
    if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) die("drop privileges");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
    execvp(program[0], program);
    perror("exec");
    _exit(127);
}
