package pool

import "time"

// clock is where the pool reads the time and arms its timers (query-wait-timeout, the
// janitor). Production uses the real one; unit tests replace it with one they advance.
type clock interface {
	Now() instant
	// AfterFunc calls f in its own goroutine (or, for a test clock, from the call that
	// moves time past d) once d has elapsed.
	AfterFunc(d time.Duration, f func()) timer
}

type timer interface {
	Stop() bool
}

// instant is a reading of the pool's clock: the time elapsed since the clock's origin,
// on a monotonic clock. The pool reads the clock on every return of a connection and
// every wait; a time.Time costs two readings of the system's clocks (wall and monotonic)
// where the pool needs one, and its arithmetic is not free either. The zero instant is
// the clock's origin, before any reading of the real clock.
type instant time.Duration

func (t instant) Add(d time.Duration) instant { return t + instant(d) }
func (t instant) Sub(u instant) time.Duration { return time.Duration(t - u) }
func (t instant) Before(u instant) bool       { return t < u }
func (t instant) After(u instant) bool        { return t > u }

type realClock struct{}

// origin is the real clock's: its instants count from the program's start.
var origin = time.Now()

func (realClock) Now() instant { return instant(time.Since(origin)) }

func (realClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }
