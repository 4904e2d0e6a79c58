package pgbench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SelfCPU is a CPU meter of this process (user and system time of all its threads), for a
// proxy served in-process.
func SelfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// clockTicks is the unit of the CPU times in /proc/PID/stat (USER_HZ), 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// ProcessCPU returns a CPU meter of another process, read from /proc/PID/stat.
func ProcessCPU(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		return parseStatCPU(string(b), false)
	}
}

// ProcessUserCPU returns a meter of another process's user CPU time alone (utime of
// /proc/PID/stat): steadier than the total for changes to the process's own code, as
// the kernel's share moves with the machine's load.
func ProcessUserCPU(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		return parseStatUserCPU(string(b))
	}
}

// ProcessTreeCPU returns a CPU meter of another process and of its children that have
// ended and been waited for (cutime and cstime): for the postmaster, the backends of
// connections that have closed, so that its growth over a run of pgbench -C is what
// PostgreSQL spent starting, serving and ending those backends.
func ProcessTreeCPU(pid int) func() (time.Duration, error) {
	return func() (time.Duration, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		return parseStatCPU(string(b), true)
	}
}

// parseStatUserCPU reads utime (field 14) of a /proc/PID/stat line.
func parseStatUserCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 12 {
		return 0, fmt.Errorf("short stat line %q", stat)
	}
	ticks, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat field %q: %w", f[11], err)
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/PID/stat line and,
// with children, cutime and cstime (16 and 17) too. The command name (field 2) is in
// parentheses and may contain spaces, so fields are counted from the last closing
// parenthesis.
func parseStatCPU(stat string, children bool) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("malformed stat line %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state), so utime (14) is f[11], stime (15) f[12], cutime (16)
	// f[13] and cstime (17) f[14].
	last := 13
	if children {
		last = 15
	}
	if len(f) < last {
		return 0, fmt.Errorf("short stat line %q", stat)
	}
	var ticks int64
	for _, s := range f[11:last] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// MachineCPU is the CPU time every processor of the machine spent busy since it started
// (user, nice, system, irq, softirq and steal of /proc/stat's first line), summed over
// the processors. Over a run it is what pgbench, the server and the hop cost together,
// with whatever else ran: its growth per transaction shows how fast the machine was
// during the run, which moves by tens of percent from one run to the next on a shared
// machine, and every process's CPU per transaction moves with it.
func MachineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseMachineCPU(string(b))
}

// parseMachineCPU reads the busy ticks of /proc/stat's "cpu" line: every field but idle
// (4th) and iowait (5th), and but guest and guest_nice (9th and 10th), which user and
// nice already count.
func parseMachineCPU(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("malformed /proc/stat line %q", line)
	}
	var ticks int64
	for i, s := range f[1:9] {
		if i == 3 || i == 4 {
			continue // idle, iowait
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
