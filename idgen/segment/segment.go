// Package segment is the Leaf-segment ID engine: each tag hands out IDs from ranges
// ("segments") reserved in the leaf_alloc table with one atomic UPDATE.
//
// IDs are unique across processes sharing leaf_alloc, and strictly increasing per tag within
// one Engine: a call that starts after another one returned gets a larger ID. A range is
// handed out only after its reservation is committed, so a crash or restart never reuses an
// ID. A reservation whose reply is lost (the connection dies after the UPDATE committed)
// is a gap: the retry reserves a new range above it, and nothing is handed out from it;
// on a graceful Close the unused tail goes back to the table when nobody reserved a range
// after ours, so a clean restart leaves no gap.
//
// Each tag keeps two buffers, as Leaf does: once less than PreloadThreshold of the current
// segment is left, one background load reserves the next one, and when the current one runs
// out Next switches to it without waiting. The step of each load follows how long the
// previous segment lasted (shorter than ShortSegment doubles it up to MaxStep, longer than
// LongSegment halves it, never below the step column).
//
// The first segment of a tag is loaded lazily, by the first Next for that tag, as in Leaf:
// a proxy reserves nothing for tags it never serves, and the first call pays one round trip.
//
// A tag missing from the engine's list (created after the last refresh) makes Next reload
// the list at once, at most once per MissRefresh, so `tag add` needs no wait. A row deleted
// and created again is a new tag to the engine: ordering holds only while the row lives.
//
// When the store is down the engine keeps serving from what it has buffered; once both
// buffers are empty Next fails at once with idgen.ErrUnavailable (it does not wait out the
// caller's deadline), and a background retry picks the store up again when it returns.
//
// TryNext is Next for callers that must never block, such as an event loop: it hands out
// a buffered ID, switching to a loaded next segment if need be, or answers false at once
// where Next would reload the tag list, wait for a load or fail.
package segment

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
)

// Defaults for the zero values of Settings.
const (
	DefaultPreloadThreshold = 0.9       // Leaf: load the next segment once less than 90% is left
	DefaultMaxStep          = 1_000_000 // Leaf's MAX_STEP
	DefaultShortSegment     = 15 * time.Minute
	DefaultLongSegment      = 30 * time.Minute
	DefaultRefreshInterval  = 60 * time.Second
	DefaultMissRefresh      = time.Second
	DefaultLoadTimeout      = 5 * time.Second
	DefaultRetryBackoff     = 100 * time.Millisecond
	DefaultMaxRetryBackoff  = 5 * time.Second

	maxMaxStep = 1 << 40 // far beyond any sane step, and doubling it cannot overflow
)

// Errors New and Start return.
var (
	ErrNoStore     = errors.New("segment: Settings.Store is required")
	ErrBadSettings = errors.New("segment: invalid settings")
	ErrStarted     = errors.New("segment: engine already started")
	ErrClosed      = errors.New("segment: engine closed")
)

// Settings configure an Engine. Zero values mean the defaults above.
type Settings struct {
	// Store reserves segments; required. NewPostgresStore gives the leaf_alloc one.
	Store Store
	// PreloadThreshold: the next segment starts loading once less than this fraction of the
	// current segment is left. In (0, 1]; 1 loads the next segment at the first ID.
	PreloadThreshold float64
	// MaxStep caps the dynamic step (a step column above it still wins: it is the minimum).
	MaxStep int64
	// ShortSegment and LongSegment: a segment that lasted less than ShortSegment doubles the
	// next step, one that lasted more than LongSegment halves it.
	ShortSegment, LongSegment time.Duration
	// RefreshInterval: how often the tag list is reloaded from the store.
	RefreshInterval time.Duration
	// MissRefresh: Next for a tag not in the list reloads the list, so a tag created a moment
	// ago works at once, but at most once per MissRefresh. Negative disables it.
	MissRefresh time.Duration
	// LoadTimeout bounds one reservation attempt. It matters when the store hangs rather
	// than refusing: callers waiting for the first failing attempt wait at most this long
	// (or their own deadline); once an attempt has failed, Next answers at once.
	LoadTimeout time.Duration
	// RetryBackoff and MaxRetryBackoff: after a failed load the engine retries in the
	// background, waiting RetryBackoff, doubling up to MaxRetryBackoff. A Next that finds
	// the buffers empty wakes the retry early, at most once per RetryBackoff.
	RetryBackoff, MaxRetryBackoff time.Duration
	// Now is the clock for the segment-duration rules and snapshots; default time.Now.
	Now func() time.Time
	// Logger receives structured logs; default logrus.StandardLogger(). Nothing is logged
	// on the path that hands out an ID from a buffered segment.
	Logger logrus.FieldLogger
	// Hooks observe the engine (metrics); every field is optional.
	Hooks Hooks
}

// Hooks are called by the engine so that a caller can keep metrics without this package
// knowing about them. They run on the engine's goroutines and must not block.
type Hooks struct {
	// OnLoad follows every reservation attempt: size is the number of IDs reserved (0 on
	// error) and took the time the store needed.
	OnLoad func(tag string, size int64, took time.Duration, err error)
	// OnUnavailable is called when Next fails with idgen.ErrUnavailable for a known tag.
	OnUnavailable func(tag string)
	// OnRefresh follows every reload of the tag list.
	OnRefresh func(tags int, took time.Duration, err error)
	// OnGiveBack follows each give-back attempt at Close: ids is how many IDs went back to
	// the store (0 when another process had reserved after us).
	OnGiveBack func(tag string, ids int64, err error)
}

// Engine is the Leaf-segment engine. It implements idgen.Generator and idgen.TryGenerator.
// Build it with New, call Start once, and Close when done.
type Engine struct {
	store                     Store
	preloadThreshold          float64
	thresholdPPM              int64
	maxStep                   int64
	shortSegment, longSegment time.Duration
	refreshInterval           time.Duration
	missRefresh               time.Duration
	loadTimeout               time.Duration
	retryBackoff, maxBackoff  time.Duration
	now                       func() time.Time
	log                       logrus.FieldLogger
	hooks                     Hooks

	// tags is an immutable map, replaced as a whole on refresh, so Next reads it without a
	// lock. Before Start and after Close it is empty and Next takes the slow path.
	tags atomic.Pointer[map[string]*tagBuffer]

	state     atomic.Int32 // stateNew, stateRunning, stateClosed
	refreshMu sync.Mutex   // serializes refreshes, writers of tags, and Close
	missSem   chan struct{}
	lastMiss  time.Time // guarded by missSem
	missErr   error     // result of the last on-demand refresh, guarded by missSem

	ctx    context.Context // canceled when Close gives up waiting for loads
	cancel context.CancelFunc
	stop   chan struct{} // closed by Close: ends the refresh loop and retry waits
	wg     sync.WaitGroup
}

const (
	stateNew int32 = iota
	stateRunning
	stateClosed
)

var (
	_ idgen.Generator    = (*Engine)(nil)
	_ idgen.TryGenerator = (*Engine)(nil)
)

// New validates s and returns an engine that is not started yet.
func New(s Settings) (*Engine, error) {
	if s.Store == nil {
		return nil, ErrNoStore
	}
	e := &Engine{
		store:            s.Store,
		preloadThreshold: orDefault(s.PreloadThreshold, DefaultPreloadThreshold),
		maxStep:          orDefault(s.MaxStep, DefaultMaxStep),
		shortSegment:     orDefault(s.ShortSegment, DefaultShortSegment),
		longSegment:      orDefault(s.LongSegment, DefaultLongSegment),
		refreshInterval:  orDefault(s.RefreshInterval, DefaultRefreshInterval),
		missRefresh:      orDefault(s.MissRefresh, DefaultMissRefresh),
		loadTimeout:      orDefault(s.LoadTimeout, DefaultLoadTimeout),
		retryBackoff:     orDefault(s.RetryBackoff, DefaultRetryBackoff),
		maxBackoff:       orDefault(s.MaxRetryBackoff, DefaultMaxRetryBackoff),
		now:              s.Now,
		log:              s.Logger,
		hooks:            s.Hooks,
		missSem:          make(chan struct{}, 1),
		stop:             make(chan struct{}),
	}
	switch {
	case e.preloadThreshold <= 0 || e.preloadThreshold > 1:
		return nil, fmt.Errorf("%w: PreloadThreshold %v is outside (0, 1]", ErrBadSettings, e.preloadThreshold)
	case e.maxStep <= 0 || e.maxStep > maxMaxStep:
		return nil, fmt.Errorf("%w: MaxStep %d is outside [1, %d]", ErrBadSettings, e.maxStep, int64(maxMaxStep))
	case e.shortSegment <= 0 || e.longSegment < e.shortSegment:
		return nil, fmt.Errorf("%w: need 0 < ShortSegment (%v) <= LongSegment (%v)", ErrBadSettings, e.shortSegment, e.longSegment)
	case e.refreshInterval <= 0 || e.loadTimeout <= 0 || e.retryBackoff <= 0:
		return nil, fmt.Errorf("%w: RefreshInterval, LoadTimeout and RetryBackoff must be positive", ErrBadSettings)
	case e.maxBackoff < e.retryBackoff:
		return nil, fmt.Errorf("%w: MaxRetryBackoff %v is below RetryBackoff %v", ErrBadSettings, e.maxBackoff, e.retryBackoff)
	}
	e.thresholdPPM = int64(math.Round(e.preloadThreshold * ppm))
	if e.now == nil {
		e.now = time.Now
	}
	if e.log == nil {
		e.log = logrus.StandardLogger()
	}
	e.log = e.log.WithField("engine", "segment")
	empty := map[string]*tagBuffer{}
	e.tags.Store(&empty)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Start loads the tag list, retrying until it succeeds or ctx ends, and starts the
// periodic refresh. Segments are loaded lazily, on the first Next of each tag.
func (e *Engine) Start(ctx context.Context) error {
	if !e.state.CompareAndSwap(stateNew, stateRunning) {
		if e.state.Load() == stateClosed {
			return ErrClosed
		}
		return ErrStarted
	}
	backoff := e.retryBackoff
	for {
		err := e.Refresh(ctx)
		if err == nil {
			break
		}
		if e.state.Load() != stateRunning {
			return ErrClosed // Close ran meanwhile
		}
		e.log.WithError(err).Warn("loading the tag list failed; retrying")
		select {
		case <-ctx.Done():
			e.state.CompareAndSwap(stateRunning, stateNew)
			return fmt.Errorf("segment: start: %w (last error: %w)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, e.maxBackoff)
	}
	e.refreshMu.Lock()
	defer e.refreshMu.Unlock()
	if e.state.Load() != stateRunning {
		return ErrClosed // Close ran while we were loading the tags
	}
	e.wg.Add(1)
	go e.refreshLoop()
	return nil
}

// Next returns the next ID of tag. It implements idgen.Generator.
//
// When the current segment has IDs left this is one map lookup and one atomic add, with no
// lock and no allocation. Otherwise it switches to the preloaded segment, or waits for the
// load in flight up to ctx's deadline (then idgen.ErrUnavailable; a ctx cancelled
// meanwhile gives context.Canceled, which is not counted as unavailable); with the store
// known to be down it fails at once with idgen.ErrUnavailable. An unknown tag gives
// idgen.ErrUnknownTag.
func (e *Engine) Next(ctx context.Context, tag string) (int64, error) {
	if tb := (*e.tags.Load())[tag]; tb != nil {
		if id, ok := e.take(tb); ok {
			return id, nil
		}
		return e.nextSlow(ctx, tb)
	}
	return e.nextUnknown(ctx, tag)
}

// TryNext returns the next ID of tag if one is at hand now, for callers that must not
// block (an event loop serving many sessions). It implements idgen.TryGenerator.
//
// It never waits on a channel, a sleep or the store, does no I/O and runs no query. With
// ok true it has issued exactly the ID Next would have issued, with the same uniqueness
// and ordering, and it starts the preload at the preload point as Next does. It switches
// to the next segment when that one is loaded already, taking the tag's mutex only for
// the switch. With ok false it has issued nothing and counted nothing (no OnUnavailable):
// the tag is unknown to the current list (TryNext does not reload it), the engine is not
// running, or both segments are used up; in the last case it starts the background load
// Next would start, unless one is in flight or the store is known to be down. The caller
// then calls Next, which waits, reloads or fails as it always does.
func (e *Engine) TryNext(tag string) (id int64, ok bool) {
	tb := (*e.tags.Load())[tag]
	if tb == nil {
		return 0, false
	}
	if id, ok := e.take(tb); ok {
		return id, true
	}
	return e.trySwitch(tb)
}

// Tags returns the known tags, sorted.
func (e *Engine) Tags() []string {
	return sortedKeys(*e.tags.Load())
}

// Close stops the refresh, waits for loads in flight (until ctx ends, then cancels them),
// and gives the unused tail of each tag back to the store when nobody reserved after us.
// Next fails with idgen.ErrUnavailable once Close has begun. Close is idempotent.
func (e *Engine) Close(ctx context.Context) error {
	e.refreshMu.Lock()
	prev := e.state.Swap(stateClosed)
	if prev == stateClosed {
		e.refreshMu.Unlock()
		return nil
	}
	tags := *e.tags.Load()
	empty := map[string]*tagBuffer{}
	e.tags.Store(&empty)
	close(e.stop)
	for _, tb := range tags {
		tb.mu.Lock()
		tb.closed = true
		tb.mu.Unlock()
	}
	e.refreshMu.Unlock()

	// Loads in flight may have reserved a range already; wait for them so that the range is
	// given back too. If ctx ends first, cancel them: the compare-and-set below then fails
	// for a range whose result we never saw, so nothing that may be in use goes back.
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		e.cancel()
		<-done
	}
	e.cancel()

	var errs []error
	for _, tag := range sortedKeys(tags) {
		if err := e.giveBack(ctx, tags[tag]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
