// Package zookeeper assigns snowflake worker IDs the way Leaf does, in the same ZooKeeper
// tree, so leafproxy and Leaf can share one.
//
// Each process, named by ip:port, owns one persistent sequential node
// /snowflake/{name}/forever/{ip}:{port}-{10-digit sequence}; the sequence number is its
// worker ID, on the first start as on every later one (Leaf leaves it 0 on the first start:
// its PR #108). The node's data, {"ip":…,"port":…,"timestamp":<ms>}, is rewritten every
// 3 s with the last millisecond used, and a restart on the same ip:port reuses the node and
// refuses to start while that timestamp is ahead of the clock. A local cache file keeps the
// worker ID known for starts while ZooKeeper is unreachable.
//
// Beyond Leaf, a lease is usable only while it holds the worker ID's liveness claim, an
// ephemeral node /snowflake/{name}/live/{workerID} (see claim.go), so that two live
// processes advertising the same ip:port never both issue IDs: the second one refuses until
// the first is gone. A start from the cache file issues nothing until ZooKeeper answers and
// the claim is made. Losing ZooKeeper after start stops issue only once the session could
// have expired (two thirds of the session timeout after the last answered check); the
// client reconnects, and after an expiry the worker ID is claimed again.
package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

// Defaults of Settings (Leaf's Curator settings and report interval).
const (
	DefaultSessionTimeout = 6 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultReportInterval = 3 * time.Second
)

// Settings configure a Source. Servers, Name and Port are required.
type Settings struct {
	// Servers are the ZooKeeper servers, host:port each.
	Servers []string
	// Name is Leaf's leaf.name: the tree is /snowflake/{Name}/forever.
	Name string
	// IP and Port name this process in the tree (Leaf: its first non-loopback IPv4
	// address and leaf.snowflake.port). IP defaults to the first non-loopback IPv4.
	IP   string
	Port string
	// SessionTimeout of the ZooKeeper session. 0 means DefaultSessionTimeout. It also
	// fences the worker ID: IDs stop two thirds of it after the last answered check of the
	// liveness claim (see claim.go), so the servers' maxSessionTimeout must not be below it.
	SessionTimeout time.Duration
	// ConnectTimeout is how long Acquire waits for ZooKeeper before it falls back to the
	// cache file. 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// ReportInterval between rewrites of the node data. 0 means DefaultReportInterval.
	ReportInterval time.Duration
	// CacheDir holds the cache file {CacheDir}/{Name}/leafconf/{Port}/workerID.properties.
	// The default is os.TempDir(), as in Leaf.
	CacheDir string
	// MaxWorkerID is the largest worker ID the engine's layout holds; a larger sequence
	// number fails Acquire with worker.ErrExhausted. 0 means worker.MaxID (1023).
	MaxWorkerID int64
	// Now is the wall clock the stored timestamp is checked against; nil means time.Now.
	Now func() time.Time
	// Logger receives connection and report events; nil means logrus' standard logger.
	Logger logrus.FieldLogger
	// Hooks count reconnects, session expiries and failed reports.
	Hooks worker.Hooks
}

// Source hands out Leaf-compatible worker IDs. It implements worker.Source.
type Source struct {
	s       Settings
	key     string // ip:port
	dir     string // /snowflake/{name}/forever
	liveDir string // /snowflake/{name}/live: the liveness claims
	cache   cacheFile
}

var _ worker.Source = (*Source)(nil)

// New validates the settings.
func New(s Settings) (*Source, error) {
	if len(s.Servers) == 0 {
		return nil, errors.New("zookeeper worker source: no servers")
	}
	if s.Name == "" || strings.Contains(s.Name, "/") {
		return nil, fmt.Errorf("zookeeper worker source: bad name %q", s.Name)
	}
	if s.Port == "" || strings.ContainsAny(s.Port, "/-") {
		return nil, fmt.Errorf("zookeeper worker source: bad port %q", s.Port)
	}
	if s.IP == "" {
		s.IP = firstNonLoopbackIPv4()
	}
	if s.SessionTimeout == 0 {
		s.SessionTimeout = DefaultSessionTimeout
	}
	if s.ConnectTimeout == 0 {
		s.ConnectTimeout = DefaultConnectTimeout
	}
	if s.ReportInterval == 0 {
		s.ReportInterval = DefaultReportInterval
	}
	if s.CacheDir == "" {
		s.CacheDir = os.TempDir()
	}
	if s.MaxWorkerID == 0 {
		s.MaxWorkerID = worker.MaxID
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	if s.Logger == nil {
		s.Logger = logrus.StandardLogger()
	}
	return &Source{
		s:       s,
		key:     net.JoinHostPort(s.IP, s.Port),
		dir:     path.Join("/snowflake", s.Name, "forever"),
		liveDir: path.Join("/snowflake", s.Name, "live"),
		cache:   newCacheFile(s.CacheDir, s.Name, s.Port),
	}, nil
}

// Name returns "zookeeper".
func (s *Source) Name() string { return "zookeeper" }

// NodePrefix returns the path of this process' node without its sequence number.
func (s *Source) NodePrefix() string { return path.Join(s.dir, s.key) + "-" }

// nodeData is the JSON Leaf stores in each node.
type nodeData struct {
	IP        string `json:"ip"`
	Port      string `json:"port"`
	Timestamp int64  `json:"timestamp"`
}

func (s *Source) encode(ts int64) []byte {
	b, _ := json.Marshal(nodeData{IP: s.s.IP, Port: s.s.Port, Timestamp: ts})
	return b
}

// Acquire connects to ZooKeeper, finds or creates this process' node and claims its worker
// ID. When another live process holds the claim, the lease it returns is not valid
// (ValidUntil lies in the past) and ends (Done) once that process is gone. When ZooKeeper
// cannot be reached within ConnectTimeout it takes the worker ID of the cache file, in a
// lease that is not valid either and ends once ZooKeeper answers.
func (s *Source) Acquire(ctx context.Context) (worker.Lease, error) {
	l := newLease(s)
	conn, err := l.dial()
	if err != nil {
		return nil, err
	}
	l.conn = conn // no other goroutine knows the lease yet

	err = l.waitSession(ctx, s.s.ConnectTimeout)
	if err == nil {
		err = l.register()
	}
	if err == nil {
		err = l.claim()
	}
	if err != nil && unreachable(err) && ctx.Err() == nil {
		err = l.fromCache(err)
	}
	if err != nil {
		l.shutdown()
		return nil, err
	}
	switch {
	case l.claimed:
		if err := s.cache.write(l.id, l.highWater); err != nil {
			s.s.Logger.WithError(err).WithField("path", s.cache.path).Warn("writing the worker ID cache file failed")
		}
		s.s.Logger.WithFields(logrus.Fields{"worker_id": l.id, "node": l.nodePath(), "high_water_ms": l.highWater}).
			Info("worker ID assigned by ZooKeeper and claimed")
	case l.other != nil:
		l.logHeldElsewhere()
	}
	l.start()
	return l, nil
}

// unreachable reports whether err means ZooKeeper could not be reached (as opposed to
// ZooKeeper answering with a reason to refuse).
func unreachable(err error) bool {
	return errors.Is(err, worker.ErrUnreachable) || errors.Is(err, zk.ErrNoServer) ||
		errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrSessionExpired) ||
		errors.Is(err, zk.ErrClosing)
}

// register finds the node of this ip:port, or creates it, and takes its sequence number.
func (l *lease) register() error {
	s := l.src
	if err := l.ensureDir(); err != nil {
		return err
	}
	seq, name, err := l.findNode(l.conn)
	if err != nil {
		return err
	}
	if name != "" {
		data, _, err := l.conn.Get(path.Join(s.dir, name))
		if err != nil {
			return fmt.Errorf("zookeeper worker source: read %s: %w", name, err)
		}
		var d nodeData
		if err := json.Unmarshal(data, &d); err != nil {
			return fmt.Errorf("zookeeper worker source: node %s holds %q, not Leaf's JSON: %w", name, data, err)
		}
		if now := s.s.Now().UnixMilli(); d.Timestamp > now {
			return fmt.Errorf("%w: node %s was last used at %d ms, %d ms after now",
				worker.ErrClockBehind, name, d.Timestamp, d.Timestamp-now)
		}
		if err := l.setID(seq, name); err != nil {
			return err
		}
		l.highWater = d.Timestamp
		l.persisted.Store(d.Timestamp)
		return nil
	}
	// New ip:port. The sequence number ZooKeeper assigns is unique in the directory, so
	// processes starting together each get their own worker ID.
	created, err := l.conn.Create(s.NodePrefix(), s.encode(s.s.Now().UnixMilli()), zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		return fmt.Errorf("zookeeper worker source: create %s: %w", s.NodePrefix(), err)
	}
	name = path.Base(created)
	seq, err = sequenceOf(name, s.key)
	if err == nil {
		err = l.setID(seq, name)
	}
	if err != nil {
		// A node past the last worker ID is of no use to anyone: remove it.
		_ = l.conn.Delete(created, -1)
		return err
	}
	return nil
}

func (l *lease) setID(seq int64, name string) error {
	if seq > l.src.s.MaxWorkerID {
		return fmt.Errorf("%w: ZooKeeper gave node %s sequence %d, beyond the largest worker ID %d; remove unused nodes under %s",
			worker.ErrExhausted, name, seq, l.src.s.MaxWorkerID, l.src.dir)
	}
	l.id = seq
	l.node.Store(&name)
	return nil
}

// ensureDir creates /snowflake/{name}/forever, /snowflake/{name}/live and their parents
// as persistent nodes.
func (l *lease) ensureDir() error {
	for _, dir := range []string{l.src.dir, l.src.liveDir} {
		p := ""
		for _, part := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
			p += "/" + part
			if _, err := l.conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return fmt.Errorf("zookeeper worker source: create %s: %w", p, err)
			}
		}
	}
	return nil
}

// findNode returns the node of this ip:port, or "" when it has none. Should a race have
// left several, the lowest sequence number wins.
func (l *lease) findNode(c *zk.Conn) (int64, string, error) {
	children, _, err := c.Children(l.src.dir)
	if err != nil {
		return 0, "", fmt.Errorf("zookeeper worker source: list %s: %w", l.src.dir, err)
	}
	best, bestName := int64(-1), ""
	for _, c := range children {
		seq, err := sequenceOf(c, l.src.key)
		if err != nil {
			continue
		}
		if best < 0 || seq < best {
			best, bestName = seq, c
		}
	}
	return best, bestName, nil
}

// sequenceOf parses "{key}-{10 digits}".
func sequenceOf(name, key string) (int64, error) {
	digits, ok := strings.CutPrefix(name, key+"-")
	if !ok || len(digits) < 10 {
		return 0, fmt.Errorf("zookeeper worker source: node %q is not %s-<sequence>", name, key)
	}
	return strconv.ParseInt(digits, 10, 64)
}

// fromCache takes the worker ID from the cache file after ZooKeeper could not be reached.
func (l *lease) fromCache(zkErr error) error {
	s := l.src
	id, ts, err := s.cache.read()
	if err != nil {
		return fmt.Errorf("%w: %v; and no usable cache file: %v", worker.ErrUnreachable, zkErr, err)
	}
	if now := s.s.Now().UnixMilli(); ts > now {
		return fmt.Errorf("%w: cache file %s records %d ms, %d ms after now", worker.ErrClockBehind, s.cache.path, ts, ts-now)
	}
	if id < 0 || id > s.s.MaxWorkerID {
		return fmt.Errorf("%w: cache file %s holds worker ID %d", worker.ErrExhausted, s.cache.path, id)
	}
	l.id, l.highWater = id, ts
	l.persisted.Store(ts)
	s.s.Logger.WithError(zkErr).WithFields(logrus.Fields{"worker_id": id, "path": s.cache.path}).
		Warn("ZooKeeper unreachable at start; the worker ID of the cache file issues nothing until ZooKeeper answers and it is claimed")
	return nil
}

// firstNonLoopbackIPv4 is Leaf's Utils.getIp: the first IPv4 address that is not loopback.
func firstNonLoopbackIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// zkLogger sends the client library's lines to logrus at debug level: connection
// changes are logged once, by the lease, at the right level.
type zkLogger struct{ log logrus.FieldLogger }

func (z zkLogger) Printf(format string, args ...any) {
	z.log.WithField("component", "zk").Debugf(format, args...)
}
