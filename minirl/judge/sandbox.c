/* minirl's sandbox launcher: one process that builds a deny-by-default sandbox and runs a program in it.
 * minirl/judge/sandbox.py compiles it once per machine (`sandbox_helper`). One file, longer than the house's
 * 350 lines, on purpose: it is what a reviewer of the isolation must read, and it is read as a whole (the seccomp
 * filter, the new root and the init that reaps depend on each other's order); split, no part would make sense.
 *
 *   sandbox -u UID -t CPU_S -m AS_BYTES -f FSIZE_BYTES -p NPROC [-r REPORT] [-g CGROUP_PROCS]... [-F] [-C] [-N]
 *           [-i NEWROOT [-R SYSROOT] -s TMPFS_MB [-w HOST_DIR] [-b HOST_PATH:PATH]...] -- PROGRAM [ARGS...]
 *   sandbox -u UID -p NPROC [-g CGROUP_PROCS]... -i NEWROOT [-R SYSROOT] -b HOST_DIR:/.run/bin -c FD
 *
 * -g: join these cgroups first (a cgroup.procs file per controller; sandbox.py creates them).
 * -i: isolate. New mount, PID, network, IPC, UTS and cgroup namespaces, and a new root on the empty folder
 *     NEWROOT: read-only binds of /usr and /lib* (and /bin, /sbin), a minimal /etc, /dev/{null,full,random,
 *     urandom} (and zero, except with -c), a /proc of the new PID namespace (none with -N, the compiler, or -c),
 *     the only writable places, /work and /tmp, on one tmpfs of TMPFS_MB (`scratch`). /work is empty and owned
 *     by UID, or HOST_DIR bound read-write (-w, the compiler's output). -b binds HOST_PATH read-only at PATH (a
 *     relative PATH is in /work).
 *     The old root is detached: nothing else of the host is reachable.
 * -R: the system folders and /etc files from SYSROOT (a copy of what programs load: sysroot.py), not the host's.
 * -c: serve (with -i, instead of a program): build the sandbox once, then run what each request on the unix
 *     socket FD says (`serve`: limits, whether processes are allowed, a program file, argv, stdin/stdout/stderr).
 *     Each run gets mount, PID and IPC namespaces of its own under an init of its own (fresh /work and /tmp,
 *     PIDs from 1) and is killed and reaped with everything it started before the reply, a line "STATUS
 *     MAX_RSS_KB USER_S SYS_S". The socket closing ends the sandbox. A run this way costs ~1.3 ms instead of
 *     ~3.5 ms for a whole sandbox here, and the sandbox joins its cgroups once (a join can wait ~15 ms for an
 *     RCU grace period).
 * -F: new processes allowed (else threads only); -C: no file creation (the host's folders, "uid" mode).
 * Always: rlimits, drop to UID (no groups, no new privileges; without root UID is the caller's own), a seccomp
 * allow-list (see `install_seccomp`), then exec. SIGTERM to the launcher ends the run: it kills init and exits once
 * init is reaped, when nothing of the run is left.
 *
 * The program runs under a minimal init (PID 1 in the new namespace; a child subreaper without -i). When the
 * program exits, init kills every process left (PID 1's kill(-1), kill(-1) as UID, or the program's process
 * group as the caller's own uid) and reaps them all, so REPORT's "MAX_RSS_KB USER_S SYS_S" covers every
 * descendant it reaped. Exit status: the program's, or 128+signal; 111 if the sandbox itself could not be set up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void die(const char *what) { fprintf(stderr, "sandbox: "); perror(what); _exit(111); }

static void limit(int resource, rlim_t value) {
    struct rlimit l = {value, value};
    if (setrlimit(resource, &l)) die("setrlimit");
}

static void ceiling(int resource) {                    /* soft = hard = the hard limit (infinite as root) */
    struct rlimit l;
    if (getrlimit(resource, &l)) die("getrlimit");
    limit(resource, l.rlim_max);
}

/* --- seccomp: an allow-list of what honest programs, the compiler and checkers call -------------------------- */
/* Derived from `strace -f` of the honest matrix (C++ with threads, std::async, mutexes and condition variables, deep
 * recursion, big arrays, heavy output; Python with the standard library modules contest programs import, threads
 * and deep recursion; g++ with and without the PCH, gold, -pipe; a Python checker), then the calls their other
 * paths reach (libc fallbacks, subprocess for problems that allow processes). Every other call fails with ENOSYS
 * (libc then falls back, as for clone3), and the calls below that take a command are allowed only for the commands
 * listed. The judge README says how to extend it. What an allow-list closes that a deny-list never named: file
 * locks and leases on the shared system files, xattrs (kernel memory outside every limit), inotify on shared
 * inodes, futex wake-ups through shared file pages, the futex2 and AIO families, and whatever the next kernel adds. */

#if defined(__x86_64__)
#define NATIVE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_ARCH AUDIT_ARCH_AARCH64
#endif
#ifndef RWF_NOWAIT
#define RWF_NOWAIT 0x8
#endif
#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#endif
#define O_TMPFILE_BIT 020000000

static const int allowed[] = {
    /* files: the run's own tmpfs, the read-only system folders, its descriptors */
    SYS_openat, SYS_newfstatat, SYS_statx, SYS_fstat, SYS_readlinkat, SYS_faccessat, SYS_faccessat2, SYS_getdents64,
    SYS_pread64, SYS_pwrite64, SYS_readv, SYS_writev, SYS_preadv, SYS_pwritev, SYS_dup, SYS_dup3,
    SYS_close_range, SYS_getcwd, SYS_chdir, SYS_fchdir, SYS_unlinkat, SYS_renameat2,
    SYS_mkdirat, SYS_linkat, SYS_symlinkat, SYS_fchmod, SYS_fchmodat, SYS_umask, SYS_ftruncate, SYS_truncate,
    SYS_fsync, SYS_fdatasync, SYS_fallocate, SYS_sendfile, SYS_copy_file_range, SYS_ppoll, SYS_pselect6,
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_eventfd2,
    /* memory (mmap and madvise: below) */
    SYS_mprotect, SYS_mremap, SYS_msync,
    /* processes and threads (clone, fork, vfork: below) */
    SYS_execve, SYS_exit, SYS_exit_group, SYS_wait4, SYS_waitid, SYS_set_tid_address, SYS_set_robust_list,
    SYS_get_robust_list, SYS_rseq, SYS_gettid, SYS_getpid, SYS_getppid, SYS_getuid, SYS_geteuid, SYS_getgid,
    SYS_getegid, SYS_getgroups, SYS_getresuid, SYS_getresgid, SYS_getpgid, SYS_getsid, SYS_setsid, SYS_setpgid,
    SYS_sched_yield, SYS_sched_getaffinity, SYS_sched_getparam, SYS_sched_getscheduler, SYS_sched_getattr,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_getpriority, SYS_getcpu, SYS_getrlimit,
    SYS_getrusage,
    /* time, signals, the machine */
    SYS_clock_gettime, SYS_clock_getres, SYS_clock_nanosleep, SYS_nanosleep, SYS_gettimeofday, SYS_times,
    SYS_setitimer, SYS_getitimer, SYS_rt_sigaction, SYS_rt_sigprocmask, SYS_rt_sigreturn, SYS_rt_sigsuspend,
    SYS_rt_sigpending, SYS_rt_sigtimedwait, SYS_sigaltstack, SYS_restart_syscall, SYS_uname, SYS_getrandom,
    SYS_timer_create, SYS_timer_settime, SYS_timer_gettime, SYS_timer_delete, SYS_timer_getoverrun,
#ifdef __x86_64__  /* the older calls x86-64 still has (aarch64 has only the *at forms above) */
    SYS_open, SYS_stat, SYS_lstat, SYS_access, SYS_readlink, SYS_getdents, SYS_dup2, SYS_unlink,
    SYS_rename, SYS_renameat, SYS_mkdir, SYS_rmdir, SYS_link, SYS_symlink, SYS_chmod, SYS_creat, SYS_poll,
    SYS_select, SYS_epoll_create, SYS_epoll_wait, SYS_getpgrp, SYS_time, SYS_alarm, SYS_pause, SYS_arch_prctl,
#endif
};
/* denied only where the run shares the host's folders ("uid" mode, -C): no file of its own to leave behind */
static const int create[] = {
#ifdef __x86_64__
    SYS_creat, SYS_mkdir, SYS_link, SYS_symlink, SYS_rename, SYS_renameat,
#endif
    SYS_mkdirat, SYS_mknodat, SYS_linkat, SYS_symlinkat, SYS_renameat2};
/* syscalls naming a process (argument 0, or 1 for setpriority): the program's own only. Threads name
 * themselves by their own tid, which is not the pid: affinity or priority per thread is refused (EPERM). */
static const int own_pid[][2] = {
    {SYS_kill, 0}, {SYS_tgkill, 0}, {SYS_rt_sigqueueinfo, 0}, {SYS_rt_tgsigqueueinfo, 0},
    {SYS_sched_setaffinity, 0}, {SYS_sched_setparam, 0}, {SYS_sched_setscheduler, 0}, {SYS_sched_setattr, 0},
};
/* the commands of calls that take one: what the traces showed, and their harmless neighbours */
static const unsigned fcntls[] = {F_DUPFD, F_DUPFD_CLOEXEC, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_GETPIPE_SZ};
static const unsigned ioctls[] = {TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX};
static const unsigned prctls[] = {PR_SET_NAME, PR_GET_NAME, PR_SET_VMA, PR_GET_DUMPABLE, PR_CAPBSET_READ};
static const unsigned advice[] = {MADV_NORMAL, MADV_DONTNEED, MADV_FREE, MADV_HUGEPAGE, MADV_NOHUGEPAGE,
                                  MADV_DONTDUMP, MADV_DODUMP, MADV_DONTFORK, MADV_DOFORK};
#define NS_FLAGS (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | \
                  CLONE_NEWCGROUP)
#define ARG_LO(k) offsetof(struct seccomp_data, args[k])
#define ARG_HI(k) (offsetof(struct seccomp_data, args[k]) + 4)   /* little-endian: both targets here */
#define LD(off) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, off)
#define LD_NR LD(offsetof(struct seccomp_data, nr))
#define IS(v, t, f) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, v, t, f)
#define HAS(v, t, f) BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, v, t, f)
#define RET(v) BPF_STMT(BPF_RET | BPF_K, v)
#define ALLOW RET(SECCOMP_RET_ALLOW)
#define FAIL(e) RET(SECCOMP_RET_ERRNO | (e))
#define COUNT(a) (sizeof a / sizeof a[0])

static struct sock_filter f[1024];
static int n;
#define ADD(...) (f[n++] = (struct sock_filter)__VA_ARGS__)

/* Each block below tests the call number in the accumulator and, for its call, ends in ALLOW or FAIL; for any
 * other call it falls through with the number still loaded. */
static void allow(int nr) { ADD(IS(nr, 0, 1)); ADD(ALLOW); }
static void refuse(int nr, int err) { ADD(IS(nr, 0, 1)); ADD(FAIL(err)); }

static void pid_is(int nr, int arg, pid_t self) {  /* allow `nr` only if its argument is 0 or `self` */
    ADD(IS(nr, 0, 7)); ADD(LD(ARG_HI(arg))); ADD(IS(0, 0, 4)); ADD(LD(ARG_LO(arg)));
    ADD(IS(0, 1, 0)); ADD(IS((unsigned)self, 0, 1)); ADD(ALLOW); ADD(FAIL(EPERM));
}

static void allow_values(int nr, int arg, const unsigned *values, int nvalues, int err) {  /* up to 250 */
    ADD(IS(nr, 0, nvalues + 3)); ADD(LD(ARG_LO(arg)));
    for (int i = 0; i < nvalues; i++) ADD(IS(values[i], nvalues - i, 0));
    ADD(FAIL(err)); ADD(ALLOW);
}

static void refuse_flags(int nr, int arg, unsigned flags, int err) {
    ADD(IS(nr, 0, 4)); ADD(LD(ARG_LO(arg))); ADD(HAS(flags, 0, 1)); ADD(FAIL(err)); ADD(ALLOW);
}

/* Futexes: any with FUTEX_PRIVATE_FLAG (keyed by this process's memory); without it only the waits (glibc's
 * pthread_join waits on a shared futex that the kernel wakes). A shared wake is keyed by the inode of a file page:
 * before sysroot.py every sandbox mapped the same libc, and one sample could wake a sibling's wait on it. The
 * per-worker copies (-R) now keep workers apart; this stays as a second line. */
static void futex_ops(void) {
    ADD(IS(SYS_futex, 0, 7)); ADD(LD(ARG_LO(1)));
    ADD(HAS(FUTEX_PRIVATE_FLAG, 4, 0)); ADD(BPF_STMT(BPF_ALU | BPF_AND | BPF_K, FUTEX_CMD_MASK));
    ADD(IS(FUTEX_WAIT, 2, 0)); ADD(IS(FUTEX_WAIT_BITSET, 1, 0)); ADD(FAIL(EPERM)); ADD(ALLOW);
}

/* mmap: never MAP_HUGETLB (the host's huge pages are nobody's to take); without -F never MAP_SHARED with
 * MAP_ANONYMOUS: each such mapping is a new inode of the kernel's internal tmpfs, numbered by a counter for the
 * whole host that a sibling read back from its stdin's inode number (a memfd of that tmpfs, made per test):
 * 20k mappings moved it by 20k (round 5). (MAP_SHARED of /dev/zero does the same: -c sandboxes have none.) */
static void mmap_ops(int forks) {
    ADD(IS(SYS_mmap, 0, forks ? 4 : 6));
    ADD(LD(ARG_LO(3)));
    ADD(HAS(MAP_HUGETLB, forks ? 1 : 3, 0));
    if (!forks) {
        ADD(BPF_STMT(BPF_ALU | BPF_AND | BPF_K, MAP_ANONYMOUS | MAP_SHARED));
        ADD(IS(MAP_ANONYMOUS | MAP_SHARED, 1, 0));
    }
    ADD(ALLOW);
    ADD(FAIL(EPERM));
}

/* prlimit64: the program's own process, and never a new RLIMIT_CORE (at 0 a core_pattern pipe gets the dump) */
static void prlimit_ops(pid_t self) {
    ADD(IS(SYS_prlimit64, 0, 13)); ADD(LD(ARG_HI(0))); ADD(IS(0, 0, 10)); ADD(LD(ARG_LO(0)));
    ADD(IS(0, 1, 0)); ADD(IS((unsigned)self, 0, 7)); ADD(LD(ARG_LO(1))); ADD(IS(RLIMIT_CORE, 0, 4));
    ADD(LD(ARG_LO(2))); ADD(IS(0, 0, 3)); ADD(LD(ARG_HI(2))); ADD(IS(0, 0, 1)); ADD(ALLOW); ADD(FAIL(EPERM));
}

/* forks: new processes allowed (compiler, checker, a problem that asks for them); else threads only (clone
 * with CLONE_THREAD), as isolate does by default: a child could hide its CPU time (reaped by the kernel when
 * SIGCHLD is ignored) and hold a whole RLIMIT_AS of its own. create: file creation denied. */
static void install_seccomp(int forks, int create_files) {
#ifdef NATIVE_ARCH
    pid_t self = getpid();
    n = 0;
    ADD(LD(offsetof(struct seccomp_data, arch)));
    ADD(IS(NATIVE_ARCH, 1, 0));
    ADD(RET(SECCOMP_RET_KILL_PROCESS));                   /* another ABI: no such programs here */
    ADD(LD_NR);
#ifdef __x86_64__
    ADD(BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1));    /* x32 numbers alias the allowed calls */
    ADD(FAIL(EPERM));
#endif
    const int hot[] = {SYS_read, SYS_write, SYS_lseek, SYS_close, SYS_munmap, SYS_brk};
    for (unsigned i = 0; i < COUNT(hot); i++) allow(hot[i]);
    futex_ops();
    mmap_ops(forks);
    if (create_files) {
        for (unsigned i = 0; i < COUNT(create); i++) refuse(create[i], EPERM);
#ifdef __x86_64__
        refuse_flags(SYS_open, 1, O_CREAT | O_TMPFILE_BIT, EPERM);
#endif
        refuse_flags(SYS_openat, 2, O_CREAT | O_TMPFILE_BIT, EPERM);
    }
    for (unsigned i = 0; i < COUNT(allowed); i++) allow(allowed[i]);
    for (unsigned i = 0; i < COUNT(own_pid); i++) pid_is(own_pid[i][0], own_pid[i][1], self);
    prlimit_ops(self);
    /* setpriority(PRIO_PROCESS, own pid) only: PRIO_USER 0 is every process of the uid (the judge's, without root) */
    ADD(IS(SYS_setpriority, 0, 4)); ADD(LD(ARG_LO(0))); ADD(IS(PRIO_PROCESS, 1, 0)); ADD(FAIL(EPERM));
    ADD(LD_NR);
    pid_is(SYS_setpriority, 1, self);
    /* no locks or leases (POSIX record locks belong to the inode, and every sandbox reads the same /usr: a sample's
     * F_RDLCK past the end of a system file was a sibling's answer), no pipes past 64 KiB (memory outside
     * RLIMIT_AS), no SIGIO owners (signals to other processes) */
    allow_values(SYS_fcntl, 1, fcntls, COUNT(fcntls), EPERM);
    allow_values(SYS_ioctl, 1, ioctls, COUNT(ioctls), ENOTTY);
    allow_values(SYS_prctl, 0, prctls, COUNT(prctls), EPERM);
    /* no MADV_RANDOM / SEQUENTIAL / WILLNEED / COLD / PAGEOUT / POPULATE_*: readahead and residency of the shared
     * page cache are how one sample's marks on a system file reach another; no MADV_MERGEABLE (KSM merges pages
     * across processes, and a copy-on-write fault then says so) */
    allow_values(SYS_madvise, 2, advice, COUNT(advice), EPERM);
    refuse_flags(SYS_preadv2, 5, RWF_NOWAIT, EOPNOTSUPP);      /* NOWAIT: a read that says what is cached */
    refuse_flags(SYS_pwritev2, 5, RWF_NOWAIT, EOPNOTSUPP);
    if (forks) {
#ifdef __x86_64__
        allow(SYS_fork); allow(SYS_vfork);
#endif
        /* the compiler, checkers, processes=True: sysinfo (g++'s memory heuristics) counts every process on
         * the host and statfs shows its disks' free space, channels between siblings that a program (no -F)
         * is not given */
        allow(SYS_sysinfo); allow(SYS_statfs); allow(SYS_fstatfs);
        /* pipes and pidfds: what processes talk and wait through. Their inode numbers come from host-wide
         * counters (a pipe's from get_next_ino, a pidfd's from pidfs), which fstat shows: one sample advancing
         * them and a sibling reading the differences was a channel (round 5). Only here; the README says so. */
        allow(SYS_pipe2);
#ifdef __x86_64__
        allow(SYS_pipe);
#endif
        pid_is(SYS_pidfd_open, 0, self);
    }
    /* threads only without -F, never new namespaces, and never CLONE_PIDFD without -F (a pidfd's inode number
     * is a host-wide counter, above) */
    ADD(IS(SYS_clone, 0, 5));
    ADD(LD(ARG_LO(0)));                                    /* flags, low half */
    ADD(HAS(NS_FLAGS | (forks ? 0 : CLONE_PIDFD), 2, 0));
    if (forks) ADD(BPF_STMT(BPF_JMP | BPF_JA, 0));
    else ADD(HAS(CLONE_THREAD, 0, 1));
    ADD(ALLOW);
    ADD(FAIL(EPERM));
    /* fork and vfork without -F, clone3 and openat2 (flags in memory a filter cannot read: libc falls back to
     * clone and openat), sockets, namespaces, mounts, keyrings, ptrace, bpf, io_uring, memfd, System V IPC,
     * mincore, fadvise, flock, xattrs, inotify, utimes, chown, ...: not listed, so ENOSYS */
    ADD(FAIL(ENOSYS));
    if (n > (int)COUNT(f)) die("seccomp filter too long");
    struct sock_fprog prog = {(unsigned short)n, f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) die("seccomp");
#endif
}

/* --- the new root ------------------------------------------------------------------------------------------ */

static char root[2048];   /* NEWROOT: shorter than a path buffer, so at() never truncates */
static char sysroot[1024];  /* -R: where the system folders come from ("": the host's own) */

static void at(char *buf, const char *path) {          /* path inside the new root -> path from the host */
    snprintf(buf, 4096, "%s%s%s", root, path[0] == '/' ? "" : "/work/", path);
}

static void bind_path(const char *src, const char *dst, int readonly) {
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

static void system_dir(const char *src, const char *path) {  /* /bin -> usr/bin stays a link; a folder is bound */
    char link[4096], target[4096];
    ssize_t n = readlink(src, link, sizeof link - 1);
    if (n < 0) { bind_path(src, path, 1); return; }
    link[n] = 0;
    at(target, path);
    if (symlink(link, target)) die("symlink");
}

/* The new root: mount points on a small root-owned tmpfs, nothing writable by the program. -b files with a
 * relative PATH wait in /.run, -w's folder at /.run/.work, for `scratch` to bind into /work. */
static void build_root(const char *workdir, char **binds, int nbinds, int with_proc, int serving) {
    char path[4096];
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("mount private");
    if (mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")) die("mount tmpfs");
    /* with -R, a worker's own copy of what programs load (sysroot.py): sibling sandboxes then map no file in
     * common, and a futex (or any state) keyed by a file's inode cannot carry a bit between them */
    const char *system[] = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"};
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "%s%s", sysroot, system[i]);
        if (access(path, F_OK) == 0) system_dir(path, system[i]);
    }
    const char *dirs[] = {"/etc", "/dev", "/proc", "/tmp", "/work", "/.run", "/.scratch"};
    for (int i = 0; i < 7; i++) { at(path, dirs[i]); if (mkdir(path, i == 5 ? 0700 : 0755)) die("mkdir"); }
    /* what exec needs (the compiler's tools are links through /etc/alternatives; a copy has no such links) */
    const char *etc[] = {"/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"};
    for (int i = 0; i < 3; i++) { snprintf(path, sizeof path, "%s%s", sysroot, etc[i]); bind_path(path, etc[i], 1); }
    /* no /dev/zero where programs run (-c): its MAP_SHARED mappings are inodes numbered host-wide (`mmap_ops`) */
    const char *dev[] = {"/dev/null", "/dev/full", "/dev/random", "/dev/urandom", "/dev/zero"};
    for (int i = 0; i < (serving ? 4 : 5); i++) bind_path(dev[i], dev[i], 0);
    at(path, "/dev/fd"); if (symlink("/proc/self/fd", path)) die("symlink");
    /* No /proc for programs (-c) nor the compiler (-N). A program's /proc/self/pagemap says which pages of a
     * mapped file are present, and fault-around maps only pages already cached: with MADV_RANDOM, a correct
     * sample's marks on a shared library were a sibling's answer. And the compiler must not name its own
     * descriptors (`#include "/proc/self/fd/1"` opens its pipe to the assembler, which would block). */
    at(path, "/proc");
    if (with_proc && mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL)) die("mount proc");
    if (workdir) bind_path(workdir, "/.run/.work", 0);
    for (int i = 0; i < nbinds; i++) {
        char *colon = strchr(binds[i], ':'), dst[4096];
        if (!colon || !colon[1] || (colon[1] != '/' && (strchr(colon + 1, '/') || colon[1] == '.')))
            die("-b HOST_PATH:PATH (PATH absolute, or a name in /work)");
        *colon = 0;
        snprintf(dst, sizeof dst, "%s%s", colon[1] == '/' ? "" : "/.run/", colon + 1);
        bind_path(binds[i], dst, 1);
    }
    /* pivot_root(".", ".") stacks the old root over the new one; detaching it leaves only the new root */
    if (chdir(root) || syscall(SYS_pivot_root, ".", ".") || umount2(".", MNT_DETACH) || chdir("/"))
        die("pivot_root");
    root[0] = 0;                                       /* at() now names paths of the new root */
}

/* Fresh writable places (after pivot_root): a tmpfs of TMPFS_MB at /.scratch (root's, 0700: not listable), its
 * work/ (the uid's) bound at /work, or -w's folder, and its tmp/ at /tmp; the -b files bound into /work. */
static void scratch(uid_t uid, const char *tmpfs_mb, int host_work, char **binds, int nbinds) {
    char opts[64], src[4096];
    /* nr_inodes: an inode (and its dentry, ~1 KiB) is kernel memory size= never counts: 256 a MiB, 1024 at least */
    long mb = atol(tmpfs_mb);
    snprintf(opts, sizeof opts, "size=%sm,nr_inodes=%ld,mode=700", tmpfs_mb, mb * 256 < 1024 ? 1024 : mb * 256);
    if (mount("tmpfs", "/.scratch", "tmpfs", MS_NOSUID | MS_NODEV, opts)) die("mount scratch");
    if (mkdir("/.scratch/work", 0700) || chown("/.scratch/work", uid, uid) || mkdir("/.scratch/tmp", 0) ||
        chmod("/.scratch/tmp", 01777))
        die("scratch");
    bind_path("/.scratch/tmp", "/tmp", 0);
    bind_path(host_work ? "/.run/.work" : "/.scratch/work", "/work", 0);
    for (int i = 0; i < nbinds; i++) {                 /* build_root cut each at its colon */
        const char *name = binds[i] + strlen(binds[i]) + 1;
        if (name[0] == '/') continue;
        snprintf(src, sizeof src, "/.run/%s", name);
        bind_path(src, name, 1);
    }
    if (chdir("/work")) die("chdir");
}

/* A run's limits and what its seccomp filter allows (forks: new processes; create: file creation). */
struct limits { rlim_t cpu, as, fsize, nproc; int forks, create; };

/* Limits, the uid, seccomp, exec: the last steps of every run, in the process that becomes the program. Without
 * root ("rlimits" mode) the uid stays the judge's: the seccomp filter is then all that keeps the program from
 * signalling it. */
static void start(char **program, uid_t uid, const struct limits *l) {
    limit(RLIMIT_CPU, l->cpu);
    limit(RLIMIT_AS, l->as);
    limit(RLIMIT_STACK, RLIM_INFINITY);  /* main stack: bounded by RLIMIT_AS; threads: glibc's 2 MiB default (a
                                            finite limit would be every thread's size, and none would fit) */
    limit(RLIMIT_FSIZE, l->fsize);
    limit(RLIMIT_NOFILE, 64);
    if (l->nproc) limit(RLIMIT_NPROC, l->nproc);  /* 0: "rlimits" mode, where it counts the judge's processes */
    /* Every other limit too: none inherited from the judge (round 5: each POSIX timer holds ~390 bytes of kernel
     * memory that only RLIMIT_SIGPENDING bounds, and the host's was 96k: +23-31 MiB past a 16-24 MiB limit
     * without a cgroup). Signals below SIGRTMIN are delivered past the limit; 64 timers or queued real-time
     * signals are more than honest programs use. RLIMIT_RTTIME stays infinite: at 0 the kernel kills any task
     * it checks (and without RLIMIT_RTPRIO no task here can be real-time). RLIMIT_CORE: main(). */
    limit(RLIMIT_SIGPENDING, 64);
    limit(RLIMIT_MSGQUEUE, 0);
    limit(RLIMIT_MEMLOCK, 0);
    limit(RLIMIT_LOCKS, 0);
    limit(RLIMIT_NICE, 0);
    limit(RLIMIT_RTPRIO, 0);
    ceiling(RLIMIT_RTTIME);
    ceiling(RLIMIT_DATA);                         /* RLIMIT_AS bounds it */
    ceiling(RLIMIT_RSS);                          /* no effect since Linux 2.6 */
    if (uid == getuid() && setpgid(0, 0)) die("setpgid");  /* the group init kills when the program ends */
    if (uid != getuid() && (setgroups(0, NULL) || setgid(uid) || setuid(uid))) die("drop privileges");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("no_new_privs");
    install_seccomp(l->forks, l->create);
    execvp(program[0], program);
    perror("exec");
    _exit(127);
}

/* --- init: wait for the program, then kill and reap everything else ---------------------------------------- */

struct usage { long max_rss_kb; struct timeval user, sys; };

static void add(struct usage *u, const struct rusage *ru) {   /* a reaped process's own and its reaped children's */
    if (ru->ru_maxrss > u->max_rss_kb) u->max_rss_kb = ru->ru_maxrss;
    timeradd(&u->user, &ru->ru_utime, &u->user);
    timeradd(&u->sys, &ru->ru_stime, &u->sys);
}

static int reap(pid_t program, uid_t uid, int isolated, struct usage *u) {
    int st, status;
    struct rusage ru;
    pid_t pid;
    memset(u, 0, sizeof *u);
    while ((pid = wait4(-1, &st, 0, &ru)) != program) {
        if (pid > 0) add(u, &ru);
        else if (errno != EINTR) return 111;
    }
    add(u, &ru);
    status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    for (;;) {                                        /* kill, reap one, again: until no child is left */
        if (isolated) kill(-1, SIGKILL);              /* PID 1: every other process of the namespace */
        else if (uid == getuid()) kill(-program, SIGKILL);  /* the judge's own uid: the program's group only */
        else {                                        /* not PID 1: kill(-1) as the uid reaches only its own */
            pid_t killer = fork();
            if (killer == 0) {
                if (setgroups(0, NULL) || setgid(uid) || setuid(uid)) _exit(1);
                kill(-1, SIGKILL);
                _exit(0);
            }
            while (killer > 0 && waitpid(killer, &st, 0) < 0 && errno == EINTR) {}
        }
        pid = wait4(-1, &st, 0, &ru);
        if (pid > 0) add(u, &ru);
        else if (errno == ECHILD) break;
    }
    return status;
}

static int format_usage(char *buf, size_t size, int status, const struct usage *u) {
    return snprintf(buf, size, "%d %ld %ld.%06ld %ld.%06ld\n", status, u->max_rss_kb, (long)u->user.tv_sec,
                    (long)u->user.tv_usec, (long)u->sys.tv_sec, (long)u->sys.tv_usec);
}

/* While a run goes on, the judge may die (its end of the socket closes): 1 then, 0 once the run's init exits. */
static int judge_left(int sock, pid_t run_init) {
    int pidfd = syscall(SYS_pidfd_open, run_init, 0);
    if (pidfd < 0) return 0;                           /* an old kernel: no watch, the judge's timeout only */
    struct pollfd watch[2] = {{sock, POLLIN | POLLRDHUP, 0}, {pidfd, POLLIN, 0}};
    for (;;) {
        if (poll(watch, 2, -1) < 0 && errno != EINTR) break;
        if (watch[1].revents) break;
        if (watch[0].revents) { close(pidfd); return 1; }  /* the judge sends nothing mid-run: it closed */
    }
    close(pidfd);
    return 0;
}

/* -c: one run per request on `sock` until it closes. A request: the fields CPU_S, AS_BYTES, FSIZE_BYTES, TMPFS_MB,
 * FORKS (0 or 1), NAME and the program's argv, each ending in a NUL, and three file descriptors: the run's stdin,
 * stdout and stderr. The judge puts the program's file (binary or source) at /.run/bin/NAME (its folder, bound
 * there by -b), which is bound read-only at /work/NAME. */
static int serve(int sock, uid_t uid, rlim_t nproc) {
    for (;;) {
        char buf[8192], line[128], control[CMSG_SPACE(3 * sizeof(int))], *field[256], file[4096];
        struct iovec iov = {buf, sizeof buf};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n == 0) return 0;                          /* the judge closed its end: done */
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (n < 0 || !c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(3 * sizeof(int)) ||
            (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || buf[n - 1] != 0)
            return 111;
        int fds[3], nfield = 0;
        memcpy(fds, CMSG_DATA(c), sizeof fds);
        for (char *f = buf; f < buf + n && nfield < 255; f += strlen(f) + 1) field[nfield++] = f;
        field[nfield] = NULL;
        const char *name = nfield > 6 ? field[5] : "";
        if (nfield < 7 || !name[0] || name[0] == '.' || strchr(name, '/') || strspn(field[3], "0123456789") !=
            strlen(field[3]))
            return 111;
        struct limits l = {strtoull(field[0], 0, 10), strtoull(field[1], 0, 10), strtoull(field[2], 0, 10), nproc,
                           field[4][0] == '1', 0};
        /* The run's own mount, PID and IPC namespaces, under an init of its own: fresh /work and /tmp, PIDs from
         * 1, and nothing an earlier run left (files, processes, counters) is there; all of it goes with the run. */
        pid_t run_init = syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | SIGCHLD, 0, 0, 0, 0);
        if (run_init < 0) return 111;
        if (run_init == 0) {
            for (int k = 0; k < 3; k++)                /* the received ones are >= 3: 0-2 are init's own */
                if (dup2(fds[k], k) < 0) _exit(111);
            close(sock);                               /* the program must never reach the socket */
            for (int k = 0; k < 3; k++) close(fds[k]);
            scratch(uid, field[3], 0, NULL, 0);        /* and no /proc: see `build_root` */
            snprintf(file, sizeof file, "/.run/bin/%s", name);
            bind_path(file, name, 1);
            pid_t child = fork();
            if (child < 0) die("fork");
            if (child == 0) start(field + 6, uid, &l);
            for (int k = 0; k < 3; k++) close(k);      /* the program's pipes reach EOF when it is gone */
            struct usage own;
            _exit(reap(child, uid, 1, &own));          /* its usage reaches us through wait4 */
        }
        for (int k = 0; k < 3; k++) close(fds[k]);
        if (judge_left(sock, run_init)) {              /* nobody to enforce the wall limit: end it all */
            kill(-1, SIGKILL);
            return 0;
        }
        struct usage u;
        int status = reap(run_init, uid, 1, &u);
        n = format_usage(line, sizeof line, status, &u);
        if (send(sock, line, n, 0) != n) return 111;
    }
}

/* /proc/PID/cmdline is anyone's to read, and a run's init is PID 1 of its namespace: its options name host paths
 * (the cache, the cgroup and with it the judge's pid). Blank them once used (the program's own argv stays). */
static void hide_options(int n, char **argv) {
    for (int i = 0; i < n; i++) memset(argv[i], 0, strlen(argv[i]));
    prctl(PR_SET_NAME, "init");                        /* comm: the helper's file name otherwise */
}

static pid_t init_pid;                                 /* the launcher's child, for `stop` */

/* SIGTERM to the launcher (the judge, at a wall-clock limit): kill init, whose PID namespace goes with it, and
 * exit once it is reaped, so that nothing of the run is left when the judge's wait returns. */
static void stop(int sig) { (void)sig; if (init_pid > 0) kill(init_pid, SIGKILL); }

int main(int argc, char **argv) {
    uid_t uid = 0;
    struct limits l = {1, 1 << 28, 1 << 20, 64, 0, 0};
    const char *tmpfs_mb = "64", *workdir = NULL, *report_path = NULL;
    char *binds[64];
    int nbinds = 0, opt, isolated = 0, sock = -1, with_proc = 1;
    while ((opt = getopt(argc, argv, "u:t:m:f:p:r:g:i:R:s:w:b:c:FCN")) != -1) {
        switch (opt) {
        case 'u': uid = (uid_t)atol(optarg); break;
        case 't': l.cpu = strtoull(optarg, 0, 10); break;
        case 'm': l.as = strtoull(optarg, 0, 10); break;
        case 'f': l.fsize = strtoull(optarg, 0, 10); break;
        case 'p': l.nproc = strtoull(optarg, 0, 10); break;
        case 'r': report_path = optarg; break;
        case 'g': {                                    /* join a cgroup: write our pid to its cgroup.procs */
            FILE *f = fopen(optarg, "w");
            if (!f || fprintf(f, "%d\n", getpid()) < 0 || fclose(f)) die("join cgroup");
            break;
        }
        case 'i': isolated = 1; snprintf(root, sizeof root, "%s", optarg); break;
        case 'R':
            if (snprintf(sysroot, sizeof sysroot, "%s", optarg) >= (int)sizeof sysroot) die("-R: path too long");
            break;
        case 's': tmpfs_mb = optarg; break;
        case 'w': workdir = optarg; break;
        case 'b': if (nbinds < 64) binds[nbinds++] = optarg; break;
        case 'c': sock = atoi(optarg); break;
        case 'F': l.forks = 1; break;
        case 'C': l.create = 1; break;
        case 'N': with_proc = 0; break;
        default: fprintf(stderr, "sandbox: bad option\n"); return 111;
        }
    }
    /* uid 0 never; the caller's own uid only without root (no other to drop to) */
    if (uid == 0 || (uid == getuid() && geteuid() == 0) || (uid != getuid() && geteuid() != 0) ||
        (sock < 0 && optind >= argc) || (sock >= 0 && (!isolated || workdir))) {
        fprintf(stderr, "sandbox: need -u UID (not 0; not root's own) and a program (with -c: -i, and no -w)\n");
        return 111;
    }
    char **program = argv + optind;
    /* not dumpable: without root the program shares our uid, and would otherwise write our memory through
     * /proc/PID/mem (init and launcher run without the seccomp filter); exec makes the program dumpable again */
    prctl(PR_SET_DUMPABLE, 0);
    /* a single run's judge waits in the thread that started it, so that thread's end is the judge's; a serving
     * sandbox outlives the thread that started it and watches its socket instead (`judge_left`) */
    if (sock < 0) prctl(PR_SET_PDEATHSIG, SIGKILL);
    FILE *report = report_path ? fopen(report_path, "w") : NULL;  /* opened before the host disappears */
    /* 1, not 0: a core_pattern that pipes to a helper ("|/usr/lib/systemd/systemd-coredump ...") ignores the limit
     * and would hand a crashing program's memory to a root process, except at exactly 1 (the kernel's "no dump"
     * for pipes; a file dump needs a page). The filter keeps the program from lowering it (`install_seccomp`). */
    limit(RLIMIT_CORE, 1);
    /* a cgroup namespace too: /proc/self/cgroup shows "/", not the judge's cgroup path and pid */
    if (isolated && unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |
                            CLONE_NEWCGROUP))
        die("unshare");
    struct sigaction term = {.sa_handler = stop};      /* no SA_RESTART: waitpid returns EINTR, and loops */
    sigemptyset(&term.sa_mask);
    sigaction(SIGTERM, &term, NULL);
    pid_t init = fork();
    if (init < 0) die("fork");
    if (init > 0) {                                    /* stays outside: its exit status is the program's */
        int st;
        init_pid = init;
        if (report) fclose(report);
        if (sock >= 0) close(sock);                    /* init's alone: the judge sees EOF when init is gone */
        while (waitpid(init, &st, 0) < 0)
            if (errno != EINTR) return 111;
        return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
    }
    signal(SIGTERM, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!isolated) prctl(PR_SET_CHILD_SUBREAPER, 1);  /* orphans (setsid or not) come back to us */
    if (isolated) {
        build_root(workdir, binds, nbinds, with_proc && sock < 0, sock >= 0);
        if (sock >= 0) { hide_options(argc, argv); _exit(serve(sock, uid, l.nproc)); }
        scratch(uid, tmpfs_mb, workdir != NULL, binds, nbinds);
    }
    hide_options(optind, argv);
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child > 0) {
        struct usage u;
        char line[128];
        int status = reap(child, uid, isolated, &u);
        if (report) {
            fputs((format_usage(line, sizeof line, status, &u), strchr(line, ' ') + 1), report);
            fclose(report);
        }
        _exit(status);
    }
    if (report) fclose(report);
    start(program, uid, &l);
}
