package main

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/leafproxy/leafproxy/idgen"
)

type errGen struct{ err error }

func (g errGen) Next(context.Context, string) (int64, error) { return 0, g.err }

func TestIDSourceSQLStates(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("segment: %w: %q", idgen.ErrUnknownTag, "x"), "42704"},
		{idgen.ErrBadArgument, "22023"},
		{fmt.Errorf("snowflake: %w", idgen.ErrClockBackwards), "55000"},
		{idgen.ErrWorkerNotHeld, "55000"},
		{fmt.Errorf("segment: %w", idgen.ErrUnavailable), "58000"},
		{context.DeadlineExceeded, "58000"},
	} {
		src := &idSource{router: idgen.NewRouter(errGen{tc.err}, errGen{tc.err}, []string{"snow"})}
		for _, call := range []func() error{
			func() error { _, err := src.Next(ctx, "seg"); return err },
			func() error { _, err := src.Next(ctx, "snow"); return err },
			func() error { _, err := src.NextSnowflake(ctx); return err },
		} {
			err := call()
			var coded interface{ SQLState() string }
			if !errors.As(err, &coded) || coded.SQLState() != tc.want {
				t.Errorf("%v: SQLSTATE %v, want %s", tc.err, err, tc.want)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("%v: the engine error is not wrapped", tc.err)
			}
		}
	}
	// The empty tag is refused by the router itself.
	src := &idSource{router: idgen.NewRouter(errGen{nil}, nil, nil)}
	if _, err := src.Next(ctx, ""); err == nil || err.(*idError).SQLState() != "22023" {
		t.Errorf("empty tag: %v", err)
	}
	if _, err := src.NextSnowflake(ctx); err == nil || err.(*idError).SQLState() != "58000" {
		t.Errorf("no snowflake engine: %v", err)
	}
}
