"""Run a command as a pod's container would run: in the pod's network namespace, with its own hostname that
/etc/hosts maps to its IP (what the kubelet writes into a pod), and exactly the environment given.

    python pod_exec.py NETNS HOSTNAME HOSTS_FILE [SOURCE:TARGET ...] -- CMD ARGS...

Each SOURCE:TARGET is bind-mounted for the pod alone (a pod's own /tmp/ray, as each pod has its own /tmp).

The hostname matters: gloo (jax's and Paddle's CPU collectives) binds to the address its host name resolves to.
It execs the command, so its pid is the command's (the sidecar's pid file names it). Standard library only.
"""

import ctypes
import os
import sys

CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWNS = 0x40000000, 0x04000000, 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SystemExit(f"pod_exec: {what}: {os.strerror(errno)}")


def main() -> None:
    netns, hostname, hosts, *rest = sys.argv[1:]
    if "--" not in rest or rest[-1] == "--":
        raise SystemExit("usage: pod_exec.py NETNS HOSTNAME HOSTS_FILE [SOURCE:TARGET ...] -- CMD ARGS...")
    binds, command = rest[:rest.index("--")], rest[rest.index("--") + 1:]
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    check(libc.setns(fd, CLONE_NEWNET), f"setns {netns}")
    os.close(fd)
    check(libc.unshare(CLONE_NEWUTS | CLONE_NEWNS), "unshare")
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for source, target in [(hosts, "/etc/hosts"), *(b.split(":", 1) for b in binds)]:
        check(libc.mount(source.encode(), target.encode(), None, MS_BIND, None), f"bind {target}")
    check(libc.sethostname(hostname.encode(), len(hostname.encode())), "sethostname")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
