package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/httpapi"
	"github.com/leafproxy/leafproxy/internal/sqlstate"
	"github.com/leafproxy/leafproxy/proxy"
)

// sqlStateOf maps an engine error to the SQLSTATE the client sees, as the README
// documents them.
func sqlStateOf(err error) string {
	switch {
	case errors.Is(err, idgen.ErrUnknownTag):
		return sqlstate.UndefinedObject
	case errors.Is(err, idgen.ErrBadArgument):
		return sqlstate.InvalidParameterValue
	case errors.Is(err, idgen.ErrClockBackwards), errors.Is(err, idgen.ErrWorkerNotHeld):
		return sqlstate.ObjectNotInPrerequisiteState
	}
	return sqlstate.SystemError // the ID source cannot issue now
}

// idError is an engine error worded for the user of a SQL session: a message without Go
// package prefixes, a DETAIL with the engine's own account when it adds something, and a
// HINT with the fix. It tells the proxy its SQLSTATE (the proxy looks for SQLState, Detail
// and Hint methods and never imports idgen). The engine error stays wrapped for errors.Is.
type idError struct {
	err       error
	tag       string // "" for leaf_snowflake()
	snowflake bool   // the tag is served by the snowflake engine
}

func (e *idError) Unwrap() error    { return e.err }
func (e *idError) SQLState() string { return sqlStateOf(e.err) }

// what names the ID that was asked for, for the messages.
func (e *idError) what() string {
	switch {
	case e.tag == "":
		return "a snowflake ID"
	case e.snowflake:
		return fmt.Sprintf("an ID of snowflake tag %q", e.tag)
	}
	return fmt.Sprintf("an ID of tag %q", e.tag)
}

func (e *idError) Error() string {
	switch {
	case errors.Is(e.err, idgen.ErrUnknownTag):
		return fmt.Sprintf("unknown ID tag %q", e.tag)
	case errors.Is(e.err, idgen.ErrBadArgument):
		if e.tag == "" {
			return "the ID tag is empty"
		}
		return fmt.Sprintf("bad ID request for tag %q", e.tag)
	case errors.Is(e.err, idgen.ErrClockBackwards):
		return "cannot issue " + e.what() + ": the system clock moved backwards"
	case errors.Is(e.err, idgen.ErrWorkerNotHeld):
		return "cannot issue " + e.what() + ": this proxy does not hold its snowflake worker ID now"
	case errors.Is(e.err, context.Canceled), errors.Is(e.err, context.DeadlineExceeded):
		return "cannot issue " + e.what() + ": gave up waiting"
	}
	return "cannot issue " + e.what() + " now: the ID source is unavailable"
}

// Detail is the engine's own account of the failure, without the package prefixes and
// the sentinel the message already says; empty when it adds nothing.
func (e *idError) Detail() string {
	if errors.Is(e.err, idgen.ErrUnknownTag) {
		return fmt.Sprintf("No leaf_alloc row and no snowflake-tags entry is named %q.", e.tag)
	}
	return sentence(httpapi.EngineAccount(e.err))
}

func (e *idError) Hint() string {
	switch {
	case errors.Is(e.err, idgen.ErrUnknownTag):
		name := e.tag
		if config.CheckTagName(name) != nil {
			name = "NAME"
		}
		return fmt.Sprintf("Create it with \"leafproxy tag add %s --step 1000\" (proxies see new tags within 60 s), or add it to snowflake-tags to serve it from the snowflake engine.", name)
	case errors.Is(e.err, idgen.ErrBadArgument):
		return "Name a tag, as in leaf_next('order')."
	case errors.Is(e.err, idgen.ErrClockBackwards):
		return "Retry in a moment; if it repeats, check the time synchronisation (NTP) of the proxy's host."
	case errors.Is(e.err, idgen.ErrWorkerNotHeld):
		return "Retry in a moment; the proxy is renewing or acquiring its worker ID (see /readyz and the status page)."
	}
	return "Retry in a moment; the proxy keeps trying to reach its store (see /readyz and the status page)."
}

// sentence turns an error text into a DETAIL sentence: capitalized, ending with a period.
func sentence(s string) string {
	if s == "" {
		return ""
	}
	s = strings.ToUpper(s[:1]) + s[1:]
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// idSource gives the proxy IDs from the router, with SQLSTATEs on the errors. It is a
// proxy.IDProber too, so that the proxy's event loops take IDs without waiting.
type idSource struct {
	router *idgen.Router
}

var _ proxy.IDProber = (*idSource)(nil)

// fail words err for the user and gives it its SQLSTATE; the proxy counts the errors it
// answers (OnError).
func (s *idSource) fail(err error, tag string) error {
	return &idError{err: err, tag: tag, snowflake: tag != "" && s.router.IsSnowflake(tag)}
}

// Next returns the next ID of tag (leaf_next('tag') and fill rules).
func (s *idSource) Next(ctx context.Context, tag string) (int64, error) {
	id, err := s.router.Next(ctx, tag)
	if err != nil {
		return 0, s.fail(err, tag)
	}
	return id, nil
}

// NextSnowflake returns a snowflake ID (leaf_snowflake()).
func (s *idSource) NextSnowflake(ctx context.Context) (int64, error) {
	id, err := s.router.NextSnowflake(ctx)
	if err != nil {
		return 0, s.fail(err, "")
	}
	return id, nil
}

// NextBatch appends n IDs of tag to dst (leaf_next('tag', n)).
func (s *idSource) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	dst, err := s.router.NextBatch(ctx, tag, n, dst)
	if err != nil {
		return dst, s.fail(err, tag)
	}
	return dst, nil
}

// TryNext returns an ID of tag if its engine has one at hand now, without waiting (see
// idgen.TryGenerator). With ok false nothing was issued and nothing counted: the proxy
// then calls Next, which waits, or fails with its SQLSTATE and is counted.
func (s *idSource) TryNext(tag string) (int64, bool) {
	return s.router.TryNext(tag)
}

// TryNextSnowflake is TryNext for leaf_snowflake().
func (s *idSource) TryNextSnowflake() (int64, bool) {
	return s.router.TryNextSnowflake()
}
