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

// tryGen is a Generator that also implements TryGenerator and remembers what it was asked.
type tryGen struct {
	id    int64
	ok    bool
	asked []string
}

func (g *tryGen) Next(context.Context, string) (int64, error) { return g.id, nil }

func (g *tryGen) TryNext(tag string) (int64, bool) {
	g.asked = append(g.asked, tag)
	if !g.ok {
		return 0, false
	}
	return g.id, true
}

func TestRouterTryNext(t *testing.T) {
	for _, tc := range []struct {
		name      string
		segment   idgen.Generator
		snowflake idgen.Generator
		tag       string
		want      int64 // 0: ok false
	}{
		{"segment tag", &tryGen{id: 1, ok: true}, &tryGen{id: 2, ok: true}, "audit", 1},
		{"snowflake tag", &tryGen{id: 1, ok: true}, &tryGen{id: 2, ok: true}, "order", 2},
		{"engine refuses", &tryGen{id: 1}, &tryGen{id: 2, ok: true}, "audit", 0},
		{"engine without TryNext", constGen(1), &tryGen{id: 2, ok: true}, "audit", 0},
		{"engine not configured", &tryGen{id: 1, ok: true}, nil, "order", 0},
		{"empty tag", &tryGen{id: 1, ok: true}, &tryGen{id: 2, ok: true}, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := idgen.NewRouter(tc.segment, tc.snowflake, []string{"order"})
			id, ok := r.TryNext(tc.tag)
			if ok != (tc.want != 0) || id != tc.want {
				t.Fatalf("TryNext(%q) = %d, %v; want %d, %v", tc.tag, id, ok, tc.want, tc.want != 0)
			}
			// The engine is asked with the tag itself, and never for an empty tag.
			for _, g := range []idgen.Generator{tc.segment, tc.snowflake} {
				if tg, isTry := g.(*tryGen); isTry {
					for _, asked := range tg.asked {
						if asked != tc.tag || asked == "" {
							t.Fatalf("engine asked for %q, want %q", asked, tc.tag)
						}
					}
				}
			}
		})
	}
}

func TestRouterTryNextSnowflake(t *testing.T) {
	for _, tc := range []struct {
		name      string
		snowflake idgen.Generator
		want      int64 // 0: ok false
	}{
		{"engine issues", &tryGen{id: 2, ok: true}, 2},
		{"engine refuses", &tryGen{id: 2}, 0},
		{"engine without TryNext", constGen(2), 0},
		{"engine not configured", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := idgen.NewRouter(&tryGen{id: 1, ok: true}, tc.snowflake, nil)
			if id, ok := r.TryNextSnowflake(); ok != (tc.want != 0) || id != tc.want {
				t.Fatalf("TryNextSnowflake() = %d, %v; want %d, %v", id, ok, tc.want, tc.want != 0)
			}
		})
	}
}
