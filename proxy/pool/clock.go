package pool

import "time"

// clock is where the pool reads the time and arms its timers (query-wait-timeout, the
// janitor). Production uses the real one; unit tests replace it with one they advance.
type clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a test clock, from the call that
	// moves time past d) once d has elapsed.
	AfterFunc(d time.Duration, f func()) timer
}

type timer interface {
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }
