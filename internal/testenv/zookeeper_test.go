package testenv

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A server that cannot bind its client port (taken by another process since it was
// picked) exits: WaitServing reports errExited, which StartEnsemble tries again on new
// ports for, rather than waiting its whole time for a port that never answers.
func TestWaitServingSeesTheServerExit(t *testing.T) {
	cp := FindZooKeeperClasspath()
	if cp == "" {
		need(t, EnvZKClasspath, "ZooKeeper")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	cfg := "tickTime=500\ndataDir=" + filepath.Join(dir, "data") + "\nclientPort=" + strconv.Itoa(port) +
		"\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=srvr\n"
	if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	z := &ZooKeeper{Dir: dir, Port: port, classpath: cp}
	if err := z.spawn(); err != nil {
		t.Fatal(err)
	}
	defer z.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	err = z.WaitServing(ctx)
	if !errors.Is(err, errExited) {
		t.Fatalf("WaitServing on a server that cannot bind its port: %v; want errExited", err)
	}
	t.Log(err)
}
