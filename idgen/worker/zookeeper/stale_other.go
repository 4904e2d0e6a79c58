//go:build !linux

package zookeeper

// machineScope is empty where the process' scope cannot be named: no claim is then
// ever taken for stale, and a dead holder's claim is waited out until its session ends.
func machineScope() string { return "" }

func processGone(int) bool { return false }
