//go:build linux

package zookeeper_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// deadPID returns the PID of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func thisScope(t *testing.T) string {
	t.Helper()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// A claim left by a process of this host that no longer exists (kill -9, then a restart
// before ZooKeeper ended its session) is removed at once; a claim of a dead PID from
// another kernel or PID namespace is waited out, since that PID means nothing here.
func TestStaleClaimOfADeadProcessOnThisHost(t *testing.T) {
	addr := testenv.ZooKeeperAddr(t)
	for _, tc := range []struct {
		name  string
		scope string
		valid bool
	}{
		{"same host", "", true},
		{"another host", "0f0f0f0f-other-boot/pid:[4026531836]", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueName(t, addr)
			s := settings(t, addr, name, "7001")
			// The dead holder: its node, and its claim held by a session that lives on.
			holder := rawConn(t, addr)
			created := addNode(t, holder, name, "127.0.0.1:7001", time.Now().Add(-time.Second).UnixMilli())
			if _, err := holder.Create("/snowflake/"+name+"/live", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
			scope := tc.scope
			if scope == "" {
				scope = thisScope(t)
			}
			var seq int64
			fmt.Sscanf(created[strings.LastIndexByte(created, '-')+1:], "%d", &seq)
			data, _ := json.Marshal(map[string]any{"host": "gone", "pid": deadPID(t), "started": 1, "ip": "127.0.0.1", "port": "7001", "scope": scope})
			claim := fmt.Sprintf("/snowflake/%s/live/%d", name, seq)
			if _, err := holder.Create(claim, data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
			l := acquire(t, newSource(t, s))
			if l.WorkerID() != seq {
				t.Fatalf("worker %d, want the node's %d", l.WorkerID(), seq)
			}
			if valid := time.Now().Before(l.ValidUntil()); valid != tc.valid {
				t.Fatalf("lease valid %v, want %v", valid, tc.valid)
			}
		})
	}
}
