// Package postgres leases snowflake worker IDs from the leaf_worker_lease table, one row
// per worker ID 0..1023 (see the migrations).
//
// A holder claims the lowest free or expired row, renews it every few seconds while
// recording its time high-water mark, and releases it on Close. Expiry is judged by the
// database clock (now()); the holder judges its own lease with the monotonic clock: the
// lease's ValidUntil is the send time of the last successful claim or renewal plus the TTL
// minus a guard interval, so the holder stops using the ID (fencing) before the row can
// expire, and the snowflake engine checks that deadline with the reading it stamps each
// ID with, so a holder that was paused past it issues nothing, whether or not its
// renewal goroutine has run since. A takeover waits out both the high-water mark and the
// end of the previous lease (expires_at). So two live processes never use the same worker
// ID at once, and IDs are recycled when processes go away, which Leaf's ZooKeeper scheme
// (one node per ip:port, forever) cannot do. The holders' clocks must agree with the
// database's to within the guard.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen/worker"
)

// Defaults of Settings.
const (
	DefaultTTL           = 30 * time.Second
	MaxRenewInterval     = 3 * time.Second // the high-water mark is persisted at least this often
	DefaultRenewDivision = 3               // renew every TTL/3 unless that exceeds MaxRenewInterval
)

// Settings configure a Source. Only Pool is required.
type Settings struct {
	// Pool reaches the database holding leaf_worker_lease. The caller owns it.
	Pool *pgxpool.Pool
	// TTL is how long a claim or renewal holds the row. 0 means DefaultTTL.
	TTL time.Duration
	// RenewInterval is the time between renewals, each of which also persists the
	// high-water mark. 0 means TTL/3, at most MaxRenewInterval.
	RenewInterval time.Duration
	// FenceGuard: the lease counts as lost this long before the row can expire, to
	// absorb late timers and clock-rate differences. 0 means TTL/10.
	FenceGuard time.Duration
	// Holder names this process in the holder column; a suffix makes each lease unique.
	// The default is hostname:pid.
	Holder string
	// Now is the clock ValidUntil is read on; it must be the snowflake engine's. nil
	// means time.Now.
	Now func() time.Time
	// Logger receives lease events; nil means logrus' standard logger.
	Logger logrus.FieldLogger
	// Hooks count lease events (fenced, regained, renewal errors).
	Hooks worker.Hooks
}

// Source leases worker IDs from leaf_worker_lease. It implements worker.Source.
type Source struct {
	pool          *pgxpool.Pool
	ttl           time.Duration
	renewInterval time.Duration
	guard         time.Duration
	holder        string
	now           func() time.Time
	log           logrus.FieldLogger
	hooks         worker.Hooks
	seq           atomic.Int64
}

var _ worker.Source = (*Source)(nil)

// New validates the settings.
func New(s Settings) (*Source, error) {
	src := &Source{pool: s.Pool, ttl: s.TTL, renewInterval: s.RenewInterval, guard: s.FenceGuard,
		holder: s.Holder, now: s.Now, log: s.Logger, hooks: s.Hooks}
	if src.pool == nil {
		return nil, errors.New("postgres worker source: no connection pool")
	}
	if src.ttl == 0 {
		src.ttl = DefaultTTL
	}
	if src.renewInterval == 0 {
		src.renewInterval = min(src.ttl/DefaultRenewDivision, MaxRenewInterval)
	}
	if src.guard == 0 {
		src.guard = src.ttl / 10
	}
	if src.ttl < 0 || src.renewInterval <= 0 || src.guard < 0 || src.renewInterval+src.guard >= src.ttl {
		return nil, fmt.Errorf("postgres worker source: renew interval %v plus fence guard %v must be positive and below the TTL %v",
			src.renewInterval, src.guard, src.ttl)
	}
	if src.holder == "" {
		host, _ := os.Hostname()
		src.holder = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if src.now == nil {
		src.now = time.Now
	}
	if src.log == nil {
		src.log = logrus.StandardLogger()
	}
	return src, nil
}

// Name returns "postgres".
func (s *Source) Name() string { return "postgres" }

// Acquire claims the lowest worker ID whose row is free (released or never used) or
// expired. When all rows are held it fails with worker.ErrExhausted. The lease's
// HighWater is the later of the row's high-water mark and the end of its previous lease:
// the previous holder may have issued IDs up to its deadline after its last renewal.
func (s *Source) Acquire(ctx context.Context) (worker.Lease, error) {
	holder := fmt.Sprintf("%s/%d-%s", s.holder, s.seq.Add(1), randomSuffix())
	sent := s.now()
	var id, hw int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT worker_id, GREATEST(high_water_ms,
				CASE WHEN isfinite(expires_at) THEN ceil(extract(epoch FROM expires_at) * 1000)::bigint ELSE 0 END)
			FROM leaf_worker_lease
			WHERE expires_at <= now() ORDER BY worker_id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id, &hw)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: every row of leaf_worker_lease (worker IDs 0..%d) is held by a live process",
				worker.ErrExhausted, worker.MaxID)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE leaf_worker_lease
			SET holder = $2, expires_at = now() + $3::float8 * interval '1 second', update_time = now()
			WHERE worker_id = $1`, id, holder, s.ttl.Seconds())
		return err
	})
	if err != nil {
		if errors.Is(err, worker.ErrExhausted) {
			return nil, err
		}
		return nil, fmt.Errorf("postgres worker source: claim a worker ID: %w", err)
	}
	l := &lease{src: s, id: id, highWater: hw, holder: holder, stop: make(chan struct{}),
		stopped: make(chan struct{}), done: make(chan struct{})}
	l.persisted = hw
	l.extend(sent)
	s.log.WithFields(logrus.Fields{"worker_id": id, "holder": holder, "high_water_ms": hw, "ttl": s.ttl}).
		Info("leased a worker ID")
	go l.run()
	return l, nil
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

type lease struct {
	src       *Source
	id        int64
	highWater int64
	holder    string

	recorded   atomic.Int64
	persisted  int64                     // last high-water written; owned by run, then by Close
	validUntil atomic.Pointer[time.Time] // see ValidUntil; written by Acquire, run and Close

	stop      chan struct{} // closed by Close
	stopped   chan struct{} // closed when run returns
	done      chan struct{} // closed when the row was taken by someone else
	closeOnce sync.Once
}

func (l *lease) WorkerID() int64       { return l.id }
func (l *lease) HighWater() int64      { return l.highWater }
func (l *lease) Record(ms int64)       { worker.RecordMax(&l.recorded, ms) }
func (l *lease) Done() <-chan struct{} { return l.done }

// ValidUntil is the send time of the last successful claim or renewal plus TTL minus
// guard: the row cannot have expired before it, whatever happened since.
func (l *lease) ValidUntil() time.Time { return *l.validUntil.Load() }

// extend moves the deadline to sent+TTL-guard, sent being the clock reading taken before
// the claim or renewal that succeeded was sent.
func (l *lease) extend(sent time.Time) {
	t := sent.Add(l.src.ttl - l.src.guard)
	l.validUntil.Store(&t)
}

// revoke ends the lease's validity now.
func (l *lease) revoke() {
	t := l.src.now()
	l.validUntil.Store(&t)
}

func (l *lease) logger() logrus.FieldLogger {
	return l.src.log.WithFields(logrus.Fields{"worker_id": l.id, "holder": l.holder})
}

// run renews the lease until Close. Its fence timer only tells the operator and the
// metrics that the deadline passed: the deadline itself is enforced by the lease's user.
func (l *lease) run() {
	defer close(l.stopped)
	renew := time.NewTimer(l.src.renewInterval)
	defer renew.Stop()
	fence := time.NewTimer(l.ValidUntil().Sub(l.src.now()))
	defer fence.Stop()
	failing, fenced := false, false
	for {
		select {
		case <-l.stop:
			return
		case <-fence.C:
			if !fenced {
				fenced = true
				l.logger().Error("worker ID lease not renewed in time; refusing snowflake IDs until it is")
				l.src.hooks.Fenced(l.id)
			}
		case <-renew.C:
			sent := l.src.now()
			err := l.renew()
			switch {
			case errors.Is(err, errTaken):
				l.revoke()
				l.logger().Error("worker ID lease taken over by another process after it expired")
				l.src.hooks.Fenced(l.id)
				close(l.done)
				return
			case err != nil:
				if !failing {
					l.logger().WithError(err).Warn("renewing the worker ID lease failed; retrying")
				}
				failing = true
				l.src.hooks.ReportError(l.id, err)
			default:
				if failing {
					l.logger().Info("worker ID lease renewed again")
					l.src.hooks.Reconnect(l.id)
					failing = false
				}
				if !fence.Stop() {
					select {
					case <-fence.C:
					default:
					}
				}
				if !fenced && !sent.Before(l.ValidUntil()) {
					// The deadline passed while the timer could not fire (a pause).
					fenced = true
					l.logger().Error("worker ID lease lapsed before this renewal; snowflake IDs were refused meanwhile")
					l.src.hooks.Fenced(l.id)
				}
				l.extend(sent)
				fence.Reset(l.ValidUntil().Sub(l.src.now()))
				if fenced {
					fenced = false
					l.logger().Info("worker ID lease regained")
					l.src.hooks.Regained(l.id)
				}
			}
			renew.Reset(l.src.renewInterval)
		}
	}
}

var errTaken = errors.New("lease row taken by another holder")

// renew extends the row and persists the high-water mark, if the row is still ours.
func (l *lease) renew() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.src.renewInterval)
	defer cancel()
	hw := max(l.recorded.Load(), l.persisted)
	tag, err := l.src.pool.Exec(ctx, `UPDATE leaf_worker_lease
		SET expires_at = now() + $3::float8 * interval '1 second',
		    high_water_ms = GREATEST(high_water_ms, $4), update_time = now()
		WHERE worker_id = $1 AND holder = $2`, l.id, l.holder, l.src.ttl.Seconds(), hw)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errTaken
	}
	l.persisted = hw
	return nil
}

// Close stops renewing, persists the high-water mark and frees the row (expires_at =
// now(), holder NULL). A row another process took over is left alone.
func (l *lease) Close(ctx context.Context) error {
	var err error
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.stopped
		l.revoke()
		hw := max(l.recorded.Load(), l.persisted)
		tag, execErr := l.src.pool.Exec(ctx, `UPDATE leaf_worker_lease
			SET expires_at = LEAST(expires_at, now()), holder = NULL,
			    high_water_ms = GREATEST(high_water_ms, $3), update_time = now()
			WHERE worker_id = $1 AND holder = $2`, l.id, l.holder, hw)
		if execErr != nil {
			err = fmt.Errorf("postgres worker source: release worker %d: %w", l.id, execErr)
			return
		}
		if tag.RowsAffected() == 1 {
			l.persisted = hw
			l.logger().WithField("high_water_ms", hw).Info("released the worker ID")
		}
	})
	return err
}
