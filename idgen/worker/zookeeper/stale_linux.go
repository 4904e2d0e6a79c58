//go:build linux

package zookeeper

import (
	"errors"
	"os"
	"strings"
	"syscall"
)

// machineScope names the kernel and PID namespace this process runs in: the boot ID and
// the PID namespace's inode. Two claims with the same scope come from processes that
// see each other's PIDs.
func machineScope() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// processGone reports whether no process with the PID exists in this PID namespace. A
// PID that was reused counts as alive: the claim is then waited out, never taken.
func processGone(pid int) bool {
	return pid > 0 && errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
