"""Run a command inside the parts of a systemd unit's sandbox that a process can set up for itself,
where systemd is not the init system to do it (containers):

- the system call filter: only the calls named in ALLOWED (one per line, the unit's
  SystemCallFilter= sets as `systemd-analyze syscall-filter` expands them); any other call fails
  with EPERM, as the unit's SystemCallErrorNumber=EPERM makes it;
- MemoryDenyWriteExecute=yes, with systemd's own rules: EPERM for an mmap both writable and
  executable, an mprotect or pkey_mprotect adding execute, a shmat with SHM_EXEC;
- CapabilityBoundingSet= (empty), so that even root has no capability after the exec;
- NoNewPrivileges=yes, and the unit's UMask=.

    python sandbox_exec.py ALLOWED UMASK -- COMMAND [ARG...]

The filters are loaded through libseccomp, the library systemd itself uses for them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7
NR_SCMP_ERROR = -1
PROT_WRITE = 0x2
PROT_EXEC = 0x4
SHM_EXEC = 0o100000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38


def scmp_act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_init.argtypes = [ctypes.c_uint32]
lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ArgCmp)]
lib.seccomp_load.argtypes = [ctypes.c_void_p]
lib.seccomp_release.argtypes = [ctypes.c_void_p]
libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc < 0:
        raise OSError(-rc, f"{what}: {os.strerror(-rc)}")


def _load(ctx) -> None:
    try:
        _check(lib.seccomp_load(ctx), "seccomp_load")
    finally:
        lib.seccomp_release(ctx)


def allow_only(names: list[str]) -> None:
    ctx = lib.seccomp_init(scmp_act_errno(errno.EPERM))
    for name in names:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr == NR_SCMP_ERROR:
            continue  # not a system call of this architecture
        rc = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, 0, None)
        if nr >= 0:  # a negative number is a multiplexed pseudo-call this architecture does not have
            _check(rc, f"allow {name}")
    _load(ctx)


def deny_write_execute() -> None:
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    deny = scmp_act_errno(errno.EPERM)
    rules = [("mmap", PROT_WRITE | PROT_EXEC), ("mprotect", PROT_EXEC), ("pkey_mprotect", PROT_EXEC),
             ("shmat", SHM_EXEC)]
    for name, bits in rules:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        cmp = ArgCmp(2, SCMP_CMP_MASKED_EQ, bits, bits)
        _check(lib.seccomp_rule_add_array(ctx, deny, nr, 1, ctypes.byref(cmp)), f"deny {name}")
    _load(ctx)


def main(argv: list[str]) -> None:
    allowed_file, umask, sep, *command = argv
    assert sep == "--" and command, __doc__
    with open(allowed_file, encoding="ascii") as f:
        allowed = [line.strip() for line in f if line.strip()]
    if os.geteuid() == 0:
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
            last = int(f.read())
        for cap in range(last + 1):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"dropping capability {cap} from the bounding set")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")
    os.umask(int(umask, 8))
    deny_write_execute()
    allow_only(allowed)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
