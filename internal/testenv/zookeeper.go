package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ZooKeeper is one private ZooKeeper server process: standalone, or one member of an ensemble.
type ZooKeeper struct {
	Dir  string
	Port int // client port

	classpath string
	mu        sync.Mutex
	cmd       *exec.Cmd
	done      chan struct{}
}

// FindZooKeeperClasspath returns a Java class path holding ZooKeeper's server, or "".
func FindZooKeeperClasspath() string {
	if cp := os.Getenv(EnvZKClasspath); cp != "" {
		return cp
	}
	// Debian's zookeeper.jar names its dependencies in its manifest.
	if _, err := os.Stat("/usr/share/java/zookeeper.jar"); err == nil {
		return "/usr/share/java/zookeeper.jar"
	}
	for _, dir := range []string{"/usr/share/zookeeper/lib", "/opt/zookeeper/lib"} {
		jars, _ := filepath.Glob(filepath.Join(dir, "*.jar"))
		if len(jars) > 0 {
			return strings.Join(jars, ":")
		}
	}
	return ""
}

// StartZooKeeper starts a standalone server on a free loopback port.
func StartZooKeeper(ctx context.Context) (*ZooKeeper, error) {
	zks, err := StartEnsemble(ctx, 1)
	if err != nil {
		return nil, err
	}
	return zks[0], nil
}

// errExited is the error of a server process that exited while it was waited for.
var errExited = errors.New("ZooKeeper exited")

// ensembleTries is how many times StartEnsemble starts an ensemble whose server exits
// while it starts: the free ports it picked may have been taken meanwhile by another
// process of the machine (a port is free when picked, not when the JVM binds it).
const ensembleTries = 3

// StartEnsemble starts n servers forming one ensemble on loopback (n = 1: standalone) and
// waits until every one of them serves.
func StartEnsemble(ctx context.Context, n int) ([]*ZooKeeper, error) {
	for try := 1; ; try++ {
		zks, err := startEnsemble(ctx, n)
		if err == nil || try == ensembleTries || !errors.Is(err, errExited) || ctx.Err() != nil {
			return zks, err
		}
	}
}

// startEnsemble makes one try of StartEnsemble, on new ports.
func startEnsemble(ctx context.Context, n int) ([]*ZooKeeper, error) {
	cp := FindZooKeeperClasspath()
	if cp == "" {
		return nil, fmt.Errorf("ZooKeeper not found (install the zookeeper package or set %s)", EnvZKClasspath)
	}
	if _, err := exec.LookPath("java"); err != nil {
		return nil, fmt.Errorf("ZooKeeper needs java: %w", err)
	}
	type ports struct{ client, peer, election int }
	all := make([]ports, n)
	for i := range all {
		for _, p := range []*int{&all[i].client, &all[i].peer, &all[i].election} {
			port, err := FreePort()
			if err != nil {
				return nil, err
			}
			*p = port
		}
	}
	var servers strings.Builder
	if n > 1 {
		for i, p := range all {
			fmt.Fprintf(&servers, "server.%d=127.0.0.1:%d:%d\n", i+1, p.peer, p.election)
		}
	}
	zks := make([]*ZooKeeper, n)
	for i, p := range all {
		dir, err := os.MkdirTemp("", "leafproxy-zk-")
		if err != nil {
			return nil, err
		}
		z := &ZooKeeper{Dir: dir, Port: p.client, classpath: cp}
		zks[i] = z
		cfg := fmt.Sprintf(`tickTime=500
initLimit=10
syncLimit=5
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=srvr,ruok,stat
minSessionTimeout=1000
maxSessionTimeout=60000
%s`, filepath.Join(dir, "data"), p.client, servers.String())
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "data", "myid"), []byte(fmt.Sprintf("%d\n", i+1)), 0o644); err != nil {
			return nil, err
		}
		if err := z.spawn(); err != nil {
			closeAll(zks)
			return nil, err
		}
	}
	for _, z := range zks {
		if err := z.WaitServing(ctx); err != nil {
			closeAll(zks)
			return nil, err
		}
	}
	return zks, nil
}

func closeAll(zks []*ZooKeeper) {
	for _, z := range zks {
		if z != nil {
			z.Close()
		}
	}
}

// NewZooKeeper starts a private standalone server for one test.
func NewZooKeeper(t testing.TB) *ZooKeeper {
	t.Helper()
	return NewEnsemble(t, 1)[0]
}

// NewEnsemble starts a private n-server ensemble for one test.
func NewEnsemble(t testing.TB, n int) []*ZooKeeper {
	t.Helper()
	if FindZooKeeperClasspath() == "" {
		need(t, EnvZKClasspath, "ZooKeeper")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	zks, err := StartEnsemble(ctx, n)
	if err != nil {
		t.Fatalf("start ZooKeeper: %v", err)
	}
	t.Cleanup(func() { closeAll(zks) })
	return zks
}

// Addr returns host:port of the client port.
func (z *ZooKeeper) Addr() string { return fmt.Sprintf("127.0.0.1:%d", z.Port) }

func (z *ZooKeeper) spawn() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.cmd != nil {
		return fmt.Errorf("ZooKeeper on port %d already runs", z.Port)
	}
	log, err := os.OpenFile(filepath.Join(z.Dir, "zookeeper.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command("java", "-Xmx256m", "-XX:+UseSerialGC", "-Dzookeeper.admin.enableServer=false",
		"-cp", z.classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(z.Dir, "zoo.cfg"))
	cmd.Dir = z.Dir
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		log.Close()
		close(done)
	}()
	z.cmd, z.done = cmd, done
	return nil
}

// WaitServing waits until the server answers "srvr" with a mode (standalone, leader or
// follower). A server process that exits meanwhile ends the wait with errExited and the
// end of its log.
func (z *ZooKeeper) WaitServing(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err := waitFor(ctx, "ZooKeeper on "+z.Addr(), func() error {
		if z.exited() {
			cancel()
			return errExited
		}
		mode, err := z.Mode()
		if err != nil {
			return err
		}
		if mode == "" {
			return fmt.Errorf("no mode yet")
		}
		return nil
	})
	if err != nil && z.exited() {
		return fmt.Errorf("%w (client port %d); the end of its log:\n%s", errExited, z.Port, z.logTail(2000))
	}
	return err
}

// exited reports whether the server's process has exited.
func (z *ZooKeeper) exited() bool {
	z.mu.Lock()
	done := z.done
	z.mu.Unlock()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// logTail returns the last n bytes of the server's log.
func (z *ZooKeeper) logTail(n int) string {
	b, err := os.ReadFile(filepath.Join(z.Dir, "zookeeper.log"))
	if err != nil {
		return err.Error()
	}
	return string(b[max(0, len(b)-n):])
}

// Mode asks the server for its mode: "standalone", "leader" or "follower".
func (z *ZooKeeper) Mode() (string, error) {
	conn, err := net.DialTimeout("tcp", z.Addr(), 10*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", fmt.Errorf("no Mode line from %s: %v", z.Addr(), sc.Err())
}

// Stop kills the server process (SIGKILL, as a crash) and waits for it to exit.
func (z *ZooKeeper) Stop() {
	z.mu.Lock()
	cmd, done := z.cmd, z.done
	z.cmd = nil
	z.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Start starts a stopped server again with the same data and port.
func (z *ZooKeeper) Start(ctx context.Context) error {
	if err := z.spawn(); err != nil {
		return err
	}
	return z.WaitServing(ctx)
}

// Close stops the server and removes its files.
func (z *ZooKeeper) Close() {
	z.Stop()
	os.RemoveAll(z.Dir)
}
