/* minirl's sandbox launcher: one process that builds a deny-by-default sandbox and runs a program in it.
 * judge.py compiles it once per machine (sandbox.py: `_sandbox_helper`).
 *
 *   sandbox -u UID -t CPU_S -m AS_BYTES -f FSIZE_BYTES -p NPROC [-r REPORT] [-g CGROUP_PROCS]...
 *           [-i NEWROOT -s TMPFS_MB [-w HOST_DIR] [-b HOST_PATH:PATH]...] -- PROGRAM [ARGS...]
 *
 * -g: join these cgroups first (a cgroup.procs file per controller; sandbox.py creates them).
 * -i: isolate. New mount, PID, network, IPC and UTS namespaces, and a new root: a tmpfs of TMPFS_MB (the only
 *     writable place, so files count against a bound) mounted on the empty folder NEWROOT, holding read-only
 *     binds of /usr and /lib* (and /bin, /sbin), a minimal /etc, /dev/{null,zero,full,random,urandom}, a /proc
 *     of the new PID namespace, /tmp, and /work: empty and owned by UID, or HOST_DIR bound read-write (-w, the
 *     compiler's output). -b binds HOST_PATH read-only at PATH (relative paths are under /work). The old root
 *     is detached: nothing else of the host is reachable.
 * Always: rlimits, drop to UID (no groups, no new privileges), a seccomp filter (see `deny`), then exec.
 *
 * The program runs under a minimal init (PID 1 in the new namespace; a child subreaper without -i). When the
 * program exits, init kills every process left (PID 1's kill(-1), or kill(-1) as UID) and reaps them all, so
 * REPORT's "max_rss_kb user_s sys_s" covers every descendant, forked children that were never waited for
 * included. Exit status: the program's, or 128+signal; 111 if the sandbox itself could not be set up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) { fprintf(stderr, "sandbox: "); perror(what); _exit(111); }

static void limit(int resource, rlim_t value) {
    struct rlimit l = {value, value};
    if (setrlimit(resource, &l)) die("setrlimit");
}

/* --- seccomp: syscalls a contest program or a compiler never needs, and that reach past the sandbox -------- */

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif

static const int deny[] = {
    SYS_unshare, SYS_setns, SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot,   /* namespaces, mounts */
#ifdef SYS_open_tree
    SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
#endif
#ifdef SYS_io_uring_setup
    SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,                  /* its own syscall surface */
#endif
    SYS_add_key, SYS_request_key, SYS_keyctl,                 /* keyrings outlive the run, outside namespaces */
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_kcmp,
#ifdef SYS_pidfd_getfd
    SYS_pidfd_getfd,
#endif
    SYS_bpf, SYS_perf_event_open, SYS_userfaultfd, SYS_fanotify_init, SYS_open_by_handle_at, SYS_name_to_handle_at,
    SYS_memfd_create, SYS_shmget, SYS_msgget, SYS_semget,    /* memory that RLIMIT_AS does not count */
    SYS_kexec_load, SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_reboot, SYS_swapon, SYS_swapoff,
    SYS_acct, SYS_quotactl, SYS_syslog,
};
#define NS_FLAGS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | \
                  CLONE_NEWCGROUP)

static void install_seccomp(void) {
#ifdef NATIVE_ARCH
    struct sock_filter f[128];
    int n = 0, ndeny = sizeof deny / sizeof deny[0];
#define ADD(x) (f[n++] = (struct sock_filter)x)
    ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_ARCH, 1, 0));
    ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));       /* another ABI: no such programs here */
    ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
#ifdef __x86_64__
    ADD(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1));    /* x32 numbers alias the denied calls */
    ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
#endif
    for (int i = 0; i < ndeny; i++) {
        ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, deny[i], 0, 1));
        ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
    }
    /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone */
    ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1));
    ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS));
    ADD(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3));
    ADD(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])));  /* flags, low half */
    ADD(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1));
    ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
    ADD(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    struct sock_fprog prog = {(unsigned short)n, f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) die("seccomp");
#endif
}

/* --- the new root ------------------------------------------------------------------------------------------ */

static char root[2048];   /* NEWROOT: shorter than a path buffer, so at() never truncates */

static void at(char *buf, const char *path) {          /* path inside the new root -> path from the host */
    snprintf(buf, 4096, "%s%s%s", root, path[0] == '/' ? "" : "/work/", path);
}

static void bind(const char *src, const char *dst, int readonly) {
    char target[4096];
    struct stat st;
    at(target, dst);
    if (stat(src, &st)) return;                        /* absent on this system (e.g. /lib32): skip */
    if (S_ISDIR(st.st_mode)) { if (mkdir(target, 0755) && errno != EEXIST) die("mkdir"); }
    else { int fd = open(target, O_CREAT | O_WRONLY, 0644); if (fd < 0) die("mount point"); close(fd); }
    if (mount(src, target, NULL, MS_BIND, NULL)) die("bind");
    if (readonly && mount(NULL, target, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
        die("remount read-only");
}

static void system_dir(const char *path) {             /* /bin -> usr/bin stays a link; a folder is bound */
    char link[4096], target[4096];
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0) { bind(path, path, 1); return; }
    link[n] = 0;
    at(target, path);
    if (symlink(link, target)) die("symlink");
}

static void build_root(uid_t uid, const char *tmpfs_mb, const char *workdir, char **binds, int nbinds) {
    char opts[64], path[4096];
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("mount private");
    snprintf(opts, sizeof opts, "size=%sm,mode=755", tmpfs_mb);
    if (mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, opts)) die("mount tmpfs");
    const char *system[] = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"};
    for (int i = 0; i < 7; i++)
        if (access(system[i], F_OK) == 0) system_dir(system[i]);
    const char *dirs[] = {"/etc", "/dev", "/proc", "/tmp", "/work"};
    for (int i = 0; i < 5; i++) { at(path, dirs[i]); if (mkdir(path, 0755)) die("mkdir"); }
    const char *etc[] = {"/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"};  /* what exec needs */
    for (int i = 0; i < 3; i++) bind(etc[i], etc[i], 1);
    const char *dev[] = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"};
    for (int i = 0; i < 5; i++) bind(dev[i], dev[i], 0);
    at(path, "/dev/fd"); if (symlink("/proc/self/fd", path)) die("symlink");
    at(path, "/proc");
    if (mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) die("mount proc");
    at(path, "/tmp"); if (chmod(path, 01777)) die("chmod");
    at(path, "/work");
    if (workdir) bind(workdir, "/work", 0);
    else if (chown(path, uid, uid) || chmod(path, 0700)) die("chown");
    for (int i = 0; i < nbinds; i++) {
        char *colon = strchr(binds[i], ':');
        if (!colon) die("-b HOST_PATH:PATH");
        *colon = 0;
        bind(binds[i], colon + 1, 1);
    }
    /* pivot_root(".", ".") stacks the old root over the new one; detaching it leaves only the new root */
    if (chdir(root) || syscall(SYS_pivot_root, ".", ".") || umount2(".", MNT_DETACH) || chdir("/work"))
        die("pivot_root");
}

/* --- init: wait for the program, then kill and reap everything else ---------------------------------------- */

static int run_init(pid_t program, uid_t uid, int isolated, FILE *report) {
    int st, status = 111;
    pid_t pid;
    while ((pid = wait(&st)) != program)
        if (pid < 0 && errno != EINTR) return 111;
    status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    for (;;) {                                        /* kill, reap one, again: until no child is left */
        if (isolated) kill(-1, SIGKILL);              /* PID 1: every other process of the namespace */
        else {                                        /* not PID 1: kill(-1) as the uid reaches only its own */
            pid_t killer = fork();
            if (killer == 0) {
                if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) _exit(1);
                kill(-1, SIGKILL);
                _exit(0);
            }
            while (killer > 0 && waitpid(killer, &st, 0) < 0 && errno == EINTR) {}
        }
        pid = wait(&st);
        if (pid < 0 && errno == ECHILD) break;
    }
    if (report) {
        struct rusage ru;
        getrusage(RUSAGE_CHILDREN, &ru);               /* every descendant that was reaped, here or below */
        fprintf(report, "%ld %ld.%06ld %ld.%06ld\n", ru.ru_maxrss, (long)ru.ru_utime.tv_sec,
                (long)ru.ru_utime.tv_usec, (long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec);
        fclose(report);
    }
    return status;
}

int main(int argc, char **argv) {
    uid_t uid = 0;
    rlim_t cpu = 1, as = 1 << 28, fsize = 1 << 20, nproc = 64;
    const char *tmpfs_mb = "64", *workdir = NULL, *report_path = NULL;
    char *binds[64];
    int nbinds = 0, opt, isolated = 0;
    while ((opt = getopt(argc, argv, "u:t:m:f:p:r:g:i:s:w:b:")) != -1) {
        switch (opt) {
        case 'u': uid = (uid_t)atol(optarg); break;
        case 't': cpu = strtoull(optarg, 0, 10); break;
        case 'm': as = strtoull(optarg, 0, 10); break;
        case 'f': fsize = strtoull(optarg, 0, 10); break;
        case 'p': nproc = strtoull(optarg, 0, 10); break;
        case 'r': report_path = optarg; break;
        case 'g': {                                    /* join a cgroup: write our pid to its cgroup.procs */
            FILE *f = fopen(optarg, "w");
            if (!f || fprintf(f, "%d\n", getpid()) < 0 || fclose(f)) die("join cgroup");
            break;
        }
        case 'i': isolated = 1; snprintf(root, sizeof root, "%s", optarg); break;
        case 's': tmpfs_mb = optarg; break;
        case 'w': workdir = optarg; break;
        case 'b': if (nbinds < 64) binds[nbinds++] = optarg; break;
        default: fprintf(stderr, "sandbox: bad option\n"); return 111;
        }
    }
    if (optind >= argc || uid == 0) { fprintf(stderr, "sandbox: need -u UID (not 0) and a program\n"); return 111; }
    char **program = argv + optind;
    FILE *report = report_path ? fopen(report_path, "w") : NULL;  /* opened before the host disappears */
    limit(RLIMIT_CORE, 0);
    if (isolated && unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)) die("unshare");
    pid_t init = fork();
    if (init < 0) die("fork");
    if (init > 0) {                                    /* stays outside: its exit status is the program's */
        int st;
        if (report) fclose(report);
        while (waitpid(init, &st, 0) < 0)
            if (errno != EINTR) return 111;
        return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!isolated) prctl(PR_SET_CHILD_SUBREAPER, 1);  /* orphans (setsid or not) come back to us */
    if (isolated) build_root(uid, tmpfs_mb, workdir, binds, nbinds);
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child > 0) _exit(run_init(child, uid, isolated, report));
    if (report) fclose(report);
    limit(RLIMIT_CPU, cpu);
    limit(RLIMIT_AS, as);
    limit(RLIMIT_STACK, as);
    limit(RLIMIT_FSIZE, fsize);
    limit(RLIMIT_NOFILE, 64);
    limit(RLIMIT_NPROC, nproc);
    if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) die("drop privileges");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
    install_seccomp();
    execvp(program[0], program);
    perror("exec");
    _exit(127);
}
