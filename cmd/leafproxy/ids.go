package main

import (
	"context"
	"errors"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/proxy"
)

// SQLSTATEs of ID failures, as the README documents them.
const (
	stateUnknownTag  = "42704" // undefined_object
	stateBadArgument = "22023" // invalid_parameter_value
	stateNotHeld     = "55000" // object_not_in_prerequisite_state: clock backwards, worker ID not held
	stateUnavailable = "58000" // system_error: the ID source cannot issue now
)

// sqlStateOf maps an engine error to the SQLSTATE the client sees.
func sqlStateOf(err error) string {
	switch {
	case errors.Is(err, idgen.ErrUnknownTag):
		return stateUnknownTag
	case errors.Is(err, idgen.ErrBadArgument):
		return stateBadArgument
	case errors.Is(err, idgen.ErrClockBackwards), errors.Is(err, idgen.ErrWorkerNotHeld):
		return stateNotHeld
	}
	return stateUnavailable
}

// idError is an engine error that tells the proxy its SQLSTATE (the proxy looks for a
// SQLState method and never imports idgen).
type idError struct{ err error }

func (e *idError) Error() string    { return e.err.Error() }
func (e *idError) Unwrap() error    { return e.err }
func (e *idError) SQLState() string { return sqlStateOf(e.err) }

// idSource gives the proxy IDs from the router, with SQLSTATEs on the errors. It is a
// proxy.IDProber too, so that the proxy's event loops take IDs without waiting.
type idSource struct {
	router *idgen.Router
}

var _ proxy.IDProber = (*idSource)(nil)

// fail gives err its SQLSTATE; the proxy counts the errors it answers (OnError).
func (s *idSource) fail(err error) error { return &idError{err: err} }

// Next returns the next ID of tag (leaf_next('tag') and fill rules).
func (s *idSource) Next(ctx context.Context, tag string) (int64, error) {
	id, err := s.router.Next(ctx, tag)
	if err != nil {
		return 0, s.fail(err)
	}
	return id, nil
}

// NextSnowflake returns a snowflake ID (leaf_snowflake()).
func (s *idSource) NextSnowflake(ctx context.Context) (int64, error) {
	id, err := s.router.NextSnowflake(ctx)
	if err != nil {
		return 0, s.fail(err)
	}
	return id, nil
}

// NextBatch appends n IDs of tag to dst (leaf_next('tag', n)).
func (s *idSource) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	dst, err := s.router.NextBatch(ctx, tag, n, dst)
	if err != nil {
		return dst, s.fail(err)
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
