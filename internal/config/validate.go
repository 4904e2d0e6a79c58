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

	"github.com/leafproxy/leafproxy/proxy"
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
// empty, WorkerStateDir with worker-source static, UpstreamSSL, FillRules, TagKeyTypes).
// Each problem is reported as "name (origin): what is wrong"; all problems are joined
// into one error.
//
// The checks are the check functions of the settings table (config.go), run in its order:
// a new setting brings its own check in its row. A check may read other settings (the
// worker source, say) but reports only about its own.
func (c *Config) Validate() error {
	c.deriveWorkerSettings()
	var errs []error
	for _, s := range settings {
		if s.check == nil {
			continue
		}
		s.check(c, func(format string, args ...any) {
			origin := c.Origins[s.name]
			if origin == "" {
				origin = "default"
			}
			errs = append(errs, fmt.Errorf("%s (%s): %s", s.name, origin, fmt.Sprintf(format, args...)))
		})
	}
	return errors.Join(errs...)
}

// problem reports one thing wrong with the setting being checked, as fmt.Sprintf words it.
type problem func(format string, args ...any)

// deriveWorkerSettings fills in the worker settings whose default depends on others: the
// worker source follows zk, and a static source keeps its state in the default directory.
func (c *Config) deriveWorkerSettings() {
	if c.WorkerSource == "" {
		c.WorkerSource = WorkerPostgres
		if len(c.ZooKeeper) > 0 {
			c.WorkerSource = WorkerZooKeeper
		}
	}
	if c.WorkerSource == WorkerStatic && c.WorkerStateDir == "" {
		c.WorkerStateDir = DefaultWorkerStateDir()
	}
}

func checkListen(c *Config, bad problem) { badAddr(bad, c.Listen) }

func checkUpstream(c *Config, bad problem) {
	// A path is the Unix socket of the server (e.g. /var/run/postgresql/.s.PGSQL.5432).
	if !strings.HasPrefix(c.Upstream, "/") {
		badAddr(bad, c.Upstream)
	}
}

func checkUpstreamSSLMode(c *Config, bad problem) {
	mode, err := proxy.ParseSSLMode(c.UpstreamSSLMode)
	if err != nil || c.UpstreamSSLMode == "" { // the proxy reads "" as prefer; a setting must say it
		bad("%q is not one of disable, prefer, require, verify-full", c.UpstreamSSLMode)
		return
	}
	c.UpstreamSSL = mode
}

func checkUpstreamCA(c *Config, bad problem) {
	if c.UpstreamCA != "" {
		if _, err := os.Stat(c.UpstreamCA); err != nil {
			bad("%v", err)
		}
	}
}

func checkTLSCert(c *Config, bad problem) {
	switch {
	case c.TLSCert == "" && c.TLSKey != "":
		bad("tls-cert and tls-key must be given together")
	case c.TLSCert != "" && c.TLSKey != "":
		if _, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey); err != nil {
			bad("cannot load the key pair: %v", err)
		}
	}
}

func checkTLSKey(c *Config, bad problem) {
	if c.TLSKey == "" && c.TLSCert != "" {
		bad("tls-cert and tls-key must be given together")
	}
}

func checkMaxClientConns(c *Config, bad problem) {
	if c.MaxClientConns <= 0 {
		bad("%d must be at least 1", c.MaxClientConns)
	}
}

func checkMaxMessageSize(c *Config, bad problem) {
	if c.MaxMessageSize < 1<<10 {
		bad("%d is below the minimum of 1024 bytes", c.MaxMessageSize)
	}
}

func checkEventLoops(c *Config, bad problem) {
	if c.EventLoops < -1 {
		bad("%d must be -1 (none), 0 (automatic) or a number of loops", c.EventLoops)
	}
}

func checkStore(c *Config, bad problem) {
	if err := CheckStoreDSN(c.Store); err != nil {
		bad("%v", err)
	}
}

func checkHTTP(c *Config, bad problem) {
	if c.HTTP != "" {
		badAddr(bad, c.HTTP)
	}
}

func checkHTTPToken(c *Config, bad problem) {
	if strings.ContainsAny(c.HTTPToken, " \t\r\n") {
		bad("must not contain white space")
	}
}

func checkWorkerSource(c *Config, bad problem) {
	switch c.WorkerSource {
	case WorkerStatic, WorkerPostgres, WorkerZooKeeper:
	default:
		bad("%q is not one of static, postgres, zookeeper", c.WorkerSource)
	}
}

func checkWorkerID(c *Config, bad problem) {
	if c.WorkerSource == WorkerStatic && !c.IsSet("worker-id") {
		bad("required with worker-source static (two proxies must never share a worker ID)")
	}
	if c.WorkerID < 0 || c.WorkerID > MaxWorkerID {
		bad("%d is outside 0..%d", c.WorkerID, MaxWorkerID)
	} else if c.WorkerID != 0 && c.WorkerSource != WorkerStatic {
		// 0 is the default, so a file listing every key may carry it harmlessly.
		bad("only used with worker-source static, but the worker source is %s", c.WorkerSource)
	}
}

func checkWorkerStateDir(c *Config, bad problem) {
	if c.WorkerSource != WorkerStatic {
		if c.WorkerStateDir != "" {
			// "" is the default, so a file listing every key may carry it harmlessly.
			bad("only used with worker-source static, but the worker source is %s", c.WorkerSource)
		}
		return
	}
	if fi, err := os.Stat(c.WorkerStateDir); err == nil && !fi.IsDir() {
		bad("%s is not a directory", c.WorkerStateDir)
	}
}

func checkWorkerLeaseTTL(c *Config, bad problem) {
	switch {
	case c.WorkerLeaseTTL != 0 && c.WorkerLeaseTTL < time.Second:
		bad("%s must be at least 1s", c.WorkerLeaseTTL)
	case c.WorkerLeaseTTL != 0 && c.WorkerSource != WorkerPostgres:
		bad("only used with worker-source postgres, but the worker source is %s", c.WorkerSource)
	}
}

func checkZooKeeper(c *Config, bad problem) {
	if c.WorkerSource == WorkerZooKeeper && len(c.ZooKeeper) == 0 {
		bad("required with worker-source zookeeper")
	}
	for _, zk := range c.ZooKeeper {
		badAddr(bad, zk)
	}
}

func checkZooKeeperName(c *Config, bad problem) {
	if c.ZooKeeperName == "" || strings.ContainsAny(c.ZooKeeperName, "/ \t") {
		bad("%q must be non-empty, without '/' or white space", c.ZooKeeperName)
	}
}

func checkAdvertise(c *Config, bad problem) {
	if c.AdvertisedAddr != "" {
		badAddr(bad, c.AdvertisedAddr)
	}
}

func checkSnowflakeTags(c *Config, bad problem) {
	seen := map[string]bool{}
	for _, tag := range c.SnowflakeTags {
		if err := CheckTagName(tag); err != nil {
			bad("%v", err)
		}
		if seen[tag] {
			bad("tag %q listed twice", tag)
		}
		seen[tag] = true
	}
}

func checkSnowflakeEpoch(c *Config, bad problem) {
	now := time.Now().UnixMilli()
	if c.SnowflakeEpoch < 0 || c.SnowflakeEpoch > now {
		bad("%d must be between 0 and now (%d), in Unix milliseconds", c.SnowflakeEpoch, now)
	}
}

func checkMaxBackwards(c *Config, bad problem) {
	if c.MaxBackwards < 0 || c.MaxBackwards > time.Second {
		bad("%s must be between 0 and 1s", c.MaxBackwards)
	}
}

func checkMaxBatch(c *Config, bad problem) {
	if c.MaxBatch < 1 || c.MaxBatch > maxMaxBatch {
		bad("%d must be between 1 and %d", c.MaxBatch, maxMaxBatch)
	}
}

// checkFill parses the fill rules into FillRules; a table may have one rule.
func checkFill(c *Config, bad problem) {
	c.FillRules = c.FillRules[:0]
	tables := map[string]string{}
	for _, raw := range c.Fill {
		r, err := ParseFillRule(raw)
		if err != nil {
			bad("%v", err)
			continue
		}
		key := r.Schema + "." + r.Table
		if prev, dup := tables[key]; dup {
			bad("table %s has two rules: %q and %q", r.QualifiedTable(), prev, raw)
			continue
		}
		tables[key] = raw
		c.FillRules = append(c.FillRules, r)
	}
}

func checkFillRefresh(c *Config, bad problem) {
	if c.FillRefresh < time.Second {
		bad("%s must be at least 1s", c.FillRefresh)
	}
}

func checkSegmentPreload(c *Config, bad problem) {
	if !(c.SegmentPreload > 0 && c.SegmentPreload < 1) {
		bad("%v must be a fraction strictly between 0 and 1", c.SegmentPreload)
	}
}

// checkKeyTypes parses key-types into TagKeyTypes.
func checkKeyTypes(c *Config, bad problem) {
	kt, err := ParseKeyTypes(c.KeyTypes)
	if err != nil {
		bad("%v", err)
		return
	}
	c.TagKeyTypes = kt
}

func checkShutdownTimeout(c *Config, bad problem) {
	if c.ShutdownTimeout <= 0 {
		bad("%s must be positive", c.ShutdownTimeout)
	}
}

func checkLogLevel(c *Config, bad problem) {
	if _, err := logrus.ParseLevel(c.LogLevel); err != nil {
		bad("%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
}

func checkLogFormat(c *Config, bad problem) {
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("%q is not one of text, json", c.LogFormat)
	}
}

// badAddr reports addr unless it is host:port.
func badAddr(bad problem, addr string) {
	if err := checkHostPort(addr); err != nil {
		bad("%v", err)
	}
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
