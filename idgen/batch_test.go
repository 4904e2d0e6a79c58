package idgen_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/leafproxy/leafproxy/idgen"
)

// countGen counts up from 1; after fail IDs it fails with ErrUnavailable.
type countGen struct{ n, fail int64 }

func (g *countGen) Next(context.Context, string) (int64, error) {
	if g.fail > 0 && g.n >= g.fail {
		return 0, idgen.ErrUnavailable
	}
	g.n++
	return g.n, nil
}

// batchGen implements BatchGenerator and records the batches it was asked for.
type batchGen struct {
	countGen
	asked []int
}

func (g *batchGen) NextBatch(ctx context.Context, tag string, n int, dst []int64) ([]int64, error) {
	g.asked = append(g.asked, n)
	for range n {
		id, _ := g.Next(ctx, tag)
		dst = append(dst, -id)
	}
	return dst, nil
}

func TestNextBatch(t *testing.T) {
	ctx := context.Background()
	// A plain Generator: one Next per ID, appended to dst.
	ids, err := idgen.NextBatch(ctx, &countGen{}, "t", 3, []int64{9})
	if err != nil || !slices.Equal(ids, []int64{9, 1, 2, 3}) {
		t.Fatalf("fallback: %v, %v", ids, err)
	}
	// A failure part way returns the IDs issued before it.
	ids, err = idgen.NextBatch(ctx, &countGen{fail: 2}, "t", 5, nil)
	if !errors.Is(err, idgen.ErrUnavailable) || !slices.Equal(ids, []int64{1, 2}) {
		t.Fatalf("failing: %v, %v", ids, err)
	}
	// A BatchGenerator gets the batch in one call.
	b := &batchGen{}
	if ids, err = idgen.NextBatch(ctx, b, "t", 4, nil); err != nil || len(ids) != 4 || ids[0] != -1 || !slices.Equal(b.asked, []int{4}) {
		t.Fatalf("batch generator: %v, %v, asked %v", ids, err, b.asked)
	}
	if _, err := idgen.NextBatch(ctx, b, "t", 0, nil); !errors.Is(err, idgen.ErrBadArgument) {
		t.Fatalf("n=0: %v", err)
	}
	// The router sends the batch to the tag's engine.
	seg, snow := &batchGen{}, &countGen{n: 100}
	r := idgen.NewRouter(seg, snow, []string{"order"})
	if ids, err = r.NextBatch(ctx, "order", 2, nil); err != nil || !slices.Equal(ids, []int64{101, 102}) {
		t.Fatalf("snowflake tag: %v, %v", ids, err)
	}
	if ids, err = r.NextBatch(ctx, "audit", 2, nil); err != nil || !slices.Equal(ids, []int64{-1, -2}) {
		t.Fatalf("segment tag: %v, %v", ids, err)
	}
	if _, err := r.NextBatch(ctx, "", 2, nil); !errors.Is(err, idgen.ErrBadArgument) {
		t.Fatalf("empty tag: %v", err)
	}
	if _, err := idgen.NewRouter(nil, nil, nil).NextBatch(ctx, "audit", 2, nil); !errors.Is(err, idgen.ErrUnavailable) {
		t.Fatalf("no engine: %v", err)
	}
}
