package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// MaxWorkerID is the largest worker ID of the default snowflake layout (10 bits).
const MaxWorkerID = 1023

// DefaultWorkerStateDir is worker-state-dir when it is not set: leafproxy under the
// temporary directory ($TMPDIR or /tmp). All proxies of a user on a host share it, so
// two of them started with the same static worker ID find each other's lock. A system
// that empties /tmp at boot loses the mark exactly when a clock is most likely wrong:
// production should set a persistent directory such as /var/lib/leafproxy.
func DefaultWorkerStateDir() string { return filepath.Join(os.TempDir(), "leafproxy") }

// Validate checks every setting and fills in the derived ones (WorkerSource when left
// empty, WorkerStateDir with worker-source static, FillRules). Each problem is reported
// as "name (origin): what is wrong"; all problems are joined into one error.
func (c *Config) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		origin := c.Origins[name]
		if origin == "" {
			origin = "default"
		}
		errs = append(errs, fmt.Errorf("%s (%s): %s", name, origin, fmt.Sprintf(format, args...)))
	}

	if err := checkHostPort(c.Listen); err != nil {
		bad("listen", "%v", err)
	}
	// A path is the Unix socket of the server (e.g. /var/run/postgresql/.s.PGSQL.5432).
	if !strings.HasPrefix(c.Upstream, "/") {
		if err := checkHostPort(c.Upstream); err != nil {
			bad("upstream", "%v", err)
		}
	}
	switch c.UpstreamSSLMode {
	case "disable", "prefer", "require", "verify-full":
	default:
		bad("upstream-sslmode", "%q is not one of disable, prefer, require, verify-full", c.UpstreamSSLMode)
	}
	if c.UpstreamCA != "" {
		if _, err := os.Stat(c.UpstreamCA); err != nil {
			bad("upstream-ca", "%v", err)
		}
	}
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		name := "tls-key"
		if c.TLSCert == "" {
			name = "tls-cert"
		}
		bad(name, "tls-cert and tls-key must be given together")
	case c.TLSCert != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			bad("tls-cert", "cannot load the key pair: %v", err)
		}
	}
	if c.MaxClientConns <= 0 {
		bad("max-client-conns", "%d must be at least 1", c.MaxClientConns)
	}
	if c.EventLoops < -1 {
		bad("event-loops", "%d must be -1 (none), 0 (automatic) or a number of loops", c.EventLoops)
	}
	if c.MaxBatch < 1 || c.MaxBatch > maxMaxBatch {
		bad("max-batch", "%d must be between 1 and %d", c.MaxBatch, maxMaxBatch)
	}
	if c.MaxMessageSize < 1<<10 {
		bad("max-message-size", "%d is below the minimum of 1024 bytes", c.MaxMessageSize)
	}

	if err := CheckStoreDSN(c.Store); err != nil {
		bad("store", "%v", err)
	}

	if c.HTTP != "" {
		if err := checkHostPort(c.HTTP); err != nil {
			bad("http", "%v", err)
		}
	}
	if strings.ContainsAny(c.HTTPToken, " \t\r\n") {
		bad("http-token", "must not contain white space")
	}

	if c.WorkerSource == "" {
		c.WorkerSource = WorkerPostgres
		if len(c.ZooKeeper) > 0 {
			c.WorkerSource = WorkerZooKeeper
		}
	}
	switch c.WorkerSource {
	case WorkerStatic:
		if !c.IsSet("worker-id") {
			bad("worker-id", "required with worker-source static (two proxies must never share a worker ID)")
		}
	case WorkerPostgres:
	case WorkerZooKeeper:
		if len(c.ZooKeeper) == 0 {
			bad("zk", "required with worker-source zookeeper")
		}
	default:
		bad("worker-source", "%q is not one of static, postgres, zookeeper", c.WorkerSource)
	}
	if c.WorkerID < 0 || c.WorkerID > MaxWorkerID {
		bad("worker-id", "%d is outside 0..%d", c.WorkerID, MaxWorkerID)
	} else if c.WorkerID != 0 && c.WorkerSource != WorkerStatic {
		// 0 is the default, so a file listing every key may carry it harmlessly.
		bad("worker-id", "only used with worker-source static, but the worker source is %s", c.WorkerSource)
	}
	switch {
	case c.WorkerSource == WorkerStatic && c.WorkerStateDir == "":
		c.WorkerStateDir = DefaultWorkerStateDir()
	case c.WorkerSource != WorkerStatic && c.WorkerStateDir != "":
		// "" is the default, so a file listing every key may carry it harmlessly.
		bad("worker-state-dir", "only used with worker-source static, but the worker source is %s", c.WorkerSource)
	}
	if c.WorkerSource == WorkerStatic {
		if fi, err := os.Stat(c.WorkerStateDir); err == nil && !fi.IsDir() {
			bad("worker-state-dir", "%s is not a directory", c.WorkerStateDir)
		}
	}
	switch {
	case c.WorkerLeaseTTL != 0 && c.WorkerLeaseTTL < time.Second:
		bad("worker-lease-ttl", "%s must be at least 1s", c.WorkerLeaseTTL)
	case c.WorkerLeaseTTL != 0 && c.WorkerSource != WorkerPostgres:
		bad("worker-lease-ttl", "only used with worker-source postgres, but the worker source is %s", c.WorkerSource)
	}
	for _, zk := range c.ZooKeeper {
		if err := checkHostPort(zk); err != nil {
			bad("zk", "%v", err)
		}
	}
	if c.ZooKeeperName == "" || strings.ContainsAny(c.ZooKeeperName, "/ \t") {
		bad("zk-name", "%q must be non-empty, without '/' or white space", c.ZooKeeperName)
	}
	if c.AdvertisedAddr != "" {
		if err := checkHostPort(c.AdvertisedAddr); err != nil {
			bad("advertise", "%v", err)
		}
	}

	seen := map[string]bool{}
	for _, tag := range c.SnowflakeTags {
		if err := CheckTagName(tag); err != nil {
			bad("snowflake-tags", "%v", err)
		}
		if seen[tag] {
			bad("snowflake-tags", "tag %q listed twice", tag)
		}
		seen[tag] = true
	}
	now := time.Now().UnixMilli()
	if c.SnowflakeEpoch < 0 || c.SnowflakeEpoch > now {
		bad("snowflake-epoch", "%d must be between 0 and now (%d), in Unix milliseconds", c.SnowflakeEpoch, now)
	}
	if c.MaxBackwards < 0 || c.MaxBackwards > time.Second {
		bad("clock-max-backwards", "%s must be between 0 and 1s", c.MaxBackwards)
	}

	c.FillRules = c.FillRules[:0]
	tables := map[string]string{}
	for _, raw := range c.Fill {
		r, err := ParseFillRule(raw)
		if err != nil {
			bad("fill", "%v", err)
			continue
		}
		key := r.Schema + "." + r.Table
		if prev, dup := tables[key]; dup {
			bad("fill", "table %s has two rules: %q and %q", r.QualifiedTable(), prev, raw)
			continue
		}
		tables[key] = raw
		c.FillRules = append(c.FillRules, r)
	}

	if kt, err := ParseKeyTypes(c.KeyTypes); err != nil {
		bad("key-types", "%v", err)
	} else {
		c.TagKeyTypes = kt
	}
	if !(c.SegmentPreload > 0 && c.SegmentPreload < 1) {
		bad("segment-preload", "%v must be a fraction strictly between 0 and 1", c.SegmentPreload)
	}
	if c.FillRefresh < time.Second {
		bad("fill-refresh", "%s must be at least 1s", c.FillRefresh)
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "%s must be positive", c.ShutdownTimeout)
	}
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		bad("log-level", "%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format", "%q is not one of text, json", c.LogFormat)
	}
	c.validateAuth(bad)
	return errors.Join(errs...)
}

// checkHostPort accepts host:port with a numeric port (the host may be empty: all
// interfaces).
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("%q has a bad host", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has a bad port (want 0..65535)", addr)
	}
	return nil
}

// CheckStoreDSN accepts a postgres:// or postgresql:// URL with a host: the migrations
// and the engines both connect with it.
func CheckStoreDSN(dsn string) error {
	if dsn == "" {
		return errors.New("required: a PostgreSQL URL such as postgres://leaf@127.0.0.1:5432/app")
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return errors.New("not a URL (want postgres://user@host:port/database)")
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return fmt.Errorf("scheme %q is not postgres:// or postgresql://", u.Scheme)
	}
	if u.Host == "" {
		return errors.New("the URL has no host")
	}
	return nil
}

// CheckTagName accepts what fits leaf_alloc.biz_tag and reads well in a URL path: 1 to 128
// characters without white space, '/' or control characters.
func CheckTagName(tag string) error {
	if tag == "" {
		return errors.New("empty tag name")
	}
	if len(tag) > 128 {
		return fmt.Errorf("tag %.20q… is longer than 128 bytes", tag)
	}
	for _, r := range tag {
		if r <= ' ' || r == '/' || r == 0x7f {
			return fmt.Errorf("tag %q contains white space, '/' or a control character", tag)
		}
	}
	return nil
}

// maxMaxBatch bounds max-batch: a batch is held in memory and answered in one go.
const maxMaxBatch = 1_000_000
