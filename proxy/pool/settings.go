package pool

import (
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
)

// Defaults, taken from PgBouncer's so that a migrated configuration behaves the same.
const (
	DefaultPoolSize             = 20
	DefaultServerIdleTimeout    = 600 * time.Second
	DefaultServerLifetime       = 3600 * time.Second
	DefaultQueryWaitTimeout     = 120 * time.Second
	DefaultServerConnectTimeout = 15 * time.Second
	DefaultServerResetTimeout   = 15 * time.Second
	DefaultServerLoginRetry     = 15 * time.Second
	DefaultJanitorInterval      = time.Second
)

// firstLoginRetry is the first pause after a failed dial; it doubles on every further
// failure up to Settings.ServerLoginRetry.
const firstLoginRetry = 250 * time.Millisecond

// Limits are the settings that may differ from one key to another. A zero field means
// the default (or, in what Settings.PerKey returns, the value of Settings.Limits); a
// negative duration disables the timeout it names.
type Limits struct {
	// PoolSize is the most server connections a key has open or opening at once.
	PoolSize int
	// MinPoolSize is how many server connections the janitor keeps open for a key once it
	// has been used, idle or not. It never exceeds PoolSize.
	MinPoolSize int
	// ServerIdleTimeout closes a connection idle for longer, unless the key would drop
	// below MinPoolSize.
	ServerIdleTimeout time.Duration
	// ServerLifetime closes a connection older than this when it is next idle: when it
	// is given back, or when the janitor finds it idle. A connection in use is never
	// interrupted.
	ServerLifetime time.Duration
	// QueryWaitTimeout fails an Acquire that has waited this long for a connection,
	// with ErrWaitTimeout (SQLSTATE 57014).
	QueryWaitTimeout time.Duration
}

// Override returns l with the fields that o sets: sizes above zero, durations other than
// zero (a negative ServerLifetime means never).
func (l Limits) Override(o Limits) Limits {
	if o.PoolSize > 0 {
		l.PoolSize = o.PoolSize
	}
	if o.MinPoolSize > 0 {
		l.MinPoolSize = o.MinPoolSize
	}
	if o.ServerIdleTimeout != 0 {
		l.ServerIdleTimeout = o.ServerIdleTimeout
	}
	if o.ServerLifetime != 0 {
		l.ServerLifetime = o.ServerLifetime
	}
	if o.QueryWaitTimeout != 0 {
		l.QueryWaitTimeout = o.QueryWaitTimeout
	}
	return l
}

// Settings configure a Pool. Zero values mean the defaults above.
type Settings struct {
	// Limits apply to every key that PerKey does not override.
	Limits
	// PerKey, when set, returns the limits of one key (a database's or a user's
	// pool-size, say). Its zero fields take the value of Limits. It is called when a
	// key's pool is created and on Reload, with the pool's lock held: it must be quick
	// and must not call the Pool.
	PerKey func(Key) Limits
	// MaxDBConnections is the most server connections open or opening for one database,
	// across its users; 0 means no limit. A key that needs a connection while its
	// database is at the limit closes the longest-idle connection of another user of
	// that database, if there is one, and waits otherwise.
	MaxDBConnections int
	// PerDatabase, when set, returns the max-db-connections of one database; 0 takes
	// MaxDBConnections. It is called like PerKey.
	PerDatabase func(database string) int
	// ServerConnectTimeout bounds one Dial.
	ServerConnectTimeout time.Duration
	// ServerResetTimeout bounds one Reset; a connection whose reset fails or times out
	// is closed.
	ServerResetTimeout time.Duration
	// ServerLoginRetry is the longest pause between dials after dials to a key failed.
	// The pause starts at 250 ms and doubles. While it lasts, an Acquire that would need a
	// new connection for a key that has none fails at once with the last dial error.
	ServerLoginRetry time.Duration
	// JanitorInterval is how often idle connections are checked and MinPoolSize is
	// restored.
	JanitorInterval time.Duration
	// Log receives the pool's events (dial failures, connections closed by the janitor);
	// nil means the standard logrus logger.
	Log logrus.FieldLogger
}

// ErrSettings is wrapped by the errors of New and Reload for settings out of range.
var ErrSettings = errors.New("pool: invalid settings")

func (s Settings) validate() (Settings, error) {
	if s.PoolSize < 0 || s.MinPoolSize < 0 || s.MaxDBConnections < 0 {
		return s, fmt.Errorf("%w: sizes must not be negative", ErrSettings)
	}
	if s.PoolSize == 0 {
		s.PoolSize = DefaultPoolSize
	}
	if s.MinPoolSize > s.PoolSize {
		return s, fmt.Errorf("%w: min-pool-size %d exceeds pool-size %d", ErrSettings, s.MinPoolSize, s.PoolSize)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&s.ServerIdleTimeout, DefaultServerIdleTimeout)
	def(&s.ServerLifetime, DefaultServerLifetime)
	def(&s.QueryWaitTimeout, DefaultQueryWaitTimeout)
	def(&s.ServerConnectTimeout, DefaultServerConnectTimeout)
	def(&s.ServerResetTimeout, DefaultServerResetTimeout)
	def(&s.ServerLoginRetry, DefaultServerLoginRetry)
	def(&s.JanitorInterval, DefaultJanitorInterval)
	if s.ServerConnectTimeout < 0 || s.ServerResetTimeout < 0 || s.ServerLoginRetry < 0 || s.JanitorInterval < 0 {
		return s, fmt.Errorf("%w: connect, reset, login-retry and janitor intervals must be positive", ErrSettings)
	}
	if s.Log == nil {
		s.Log = logrus.StandardLogger()
	}
	return s, nil
}

// limitsFor resolves the limits of one key. A MinPoolSize above PoolSize is cut down to
// it, since a per-key override cannot be refused after the fact.
func (s *Settings) limitsFor(k Key) Limits {
	l := s.Limits
	if s.PerKey != nil {
		l = l.Override(s.PerKey(k))
	}
	if l.MinPoolSize > l.PoolSize {
		l.MinPoolSize = l.PoolSize
	}
	return l
}

func (s *Settings) maxFor(database string) int {
	if s.PerDatabase != nil {
		if n := s.PerDatabase(database); n > 0 {
			return n
		}
	}
	return s.MaxDBConnections
}
