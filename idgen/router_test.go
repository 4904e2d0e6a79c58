package idgen_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leafproxy/leafproxy/idgen"
)

type constGen int64

func (g constGen) Next(context.Context, string) (int64, error) { return int64(g), nil }

func TestRouter(t *testing.T) {
	r := idgen.NewRouter(constGen(1), constGen(2), []string{"order"})
	ctx := context.Background()
	for _, tc := range []struct {
		tag  string
		want int64
	}{{"order", 2}, {"audit", 1}, {"Order", 1}} {
		if got, err := r.Next(ctx, tc.tag); err != nil || got != tc.want {
			t.Errorf("Next(%q) = %d, %v; want %d", tc.tag, got, err, tc.want)
		}
	}
	if _, err := r.Next(ctx, ""); !errors.Is(err, idgen.ErrBadArgument) {
		t.Errorf("empty tag: %v, want ErrBadArgument", err)
	}
	if id, err := r.NextSnowflake(ctx); err != nil || id != 2 {
		t.Errorf("NextSnowflake = %d, %v", id, err)
	}
	noSnow := idgen.NewRouter(constGen(1), nil, []string{"order"})
	if _, err := noSnow.Next(ctx, "order"); !errors.Is(err, idgen.ErrUnavailable) {
		t.Errorf("missing engine: %v, want ErrUnavailable", err)
	}
}
