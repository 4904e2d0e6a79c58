package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sirupsen/logrus"

	"github.com/leafproxy/leafproxy/idgen"
	"github.com/leafproxy/leafproxy/idgen/segment"
	"github.com/leafproxy/leafproxy/idgen/snowflake"
	"github.com/leafproxy/leafproxy/idgen/worker"
	"github.com/leafproxy/leafproxy/internal/metrics"
	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/migrations"
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

// TestIDSourceTryNext runs idSource's non-blocking calls on the real engines, wrapped in
// the metrics counters as serve wires them: a segment engine on leaf_alloc and a
// snowflake engine with a static worker ID.
func TestIDSourceTryNext(t *testing.T) {
	dsn := testenv.NewDatabase(t)
	if err := migrations.Up(dsn); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES ('seg', 1000, 100)`); err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	seg, err := segment.New(segment.Settings{Store: segment.NewPostgresStore(pool), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := seg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer seg.Close(ctx)
	snow, err := snowflake.New(snowflake.Settings{Source: worker.Static{ID: 9}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := snow.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer snow.Close(ctx)
	m := metrics.New("test", nil)
	src := &idSource{router: idgen.NewRouter(m.Counting("segment", seg), m.Counting("snowflake", snow), []string{"snow"})}

	// The first segment loads lazily: TryNext starts the load and cannot wait for it.
	if id, ok := src.TryNext("seg"); ok {
		t.Fatalf("TryNext before the first load = %d, true", id)
	}
	first, err := src.Next(ctx, "seg")
	if err != nil || first != 1001 {
		t.Fatalf("Next = %d, %v; want 1001", first, err)
	}
	isSnowflake := func(id int64) bool { p := snow.Decompose(id); return p.Worker == 9 && time.Since(p.Time) < time.Minute }
	for _, tc := range []struct {
		name string
		try  func() (int64, bool)
		want func(id int64) bool // nil: ok false
		// For a refusal that stands for an error: the Next the proxy makes next, and the
		// SQLSTATE it answers.
		nextTag, state string
	}{
		{"segment tag", func() (int64, bool) { return src.TryNext("seg") }, func(id int64) bool { return id == first+1 }, "", ""},
		{"snowflake tag", func() (int64, bool) { return src.TryNext("snow") }, isSnowflake, "", ""},
		{"leaf_snowflake()", src.TryNextSnowflake, isSnowflake, "", ""},
		{"unknown tag", func() (int64, bool) { return src.TryNext("nope") }, nil, "nope", "42704"},
		{"empty tag", func() (int64, bool) { return src.TryNext("") }, nil, "", "22023"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := tc.try()
			if ok != (tc.want != nil) || ok && !tc.want(id) {
				t.Fatalf("= %d, %v; want ok=%v and a matching ID", id, ok, tc.want != nil)
			}
			if tc.state == "" {
				return
			}
			_, err := src.Next(ctx, tc.nextTag)
			var coded interface{ SQLState() string }
			if !errors.As(err, &coded) || coded.SQLState() != tc.state {
				t.Fatalf("Next(%q) after the refusal: %v, want SQLSTATE %s", tc.nextTag, err, tc.state)
			}
		})
	}
}

// TestIDErrorWording: every ID failure reaches the client with a message free of Go
// package names, the engine's account as DETAIL, a HINT with what to do, and its SQLSTATE.
func TestIDErrorWording(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name                     string
		err                      error
		tag                      string // "" asks leaf_snowflake()
		state, msg, detail, hint string
	}{
		{"unknown tag", fmt.Errorf("%w: %q", idgen.ErrUnknownTag, "nosuchtag"), "nosuchtag", "42704",
			`unknown ID tag "nosuchtag"`,
			`No leaf_alloc row and no snowflake-tags entry is named "nosuchtag".`,
			`Create it with "leafproxy tag add nosuchtag --step 1000" (proxies see new tags within 60 s), or add it to snowflake-tags to serve it from the snowflake engine.`},
		{"unknown tag with an odd name", fmt.Errorf("%w: %q", idgen.ErrUnknownTag, "a b"), "a b", "42704",
			`unknown ID tag "a b"`,
			`No leaf_alloc row and no snowflake-tags entry is named "a b".`,
			`Create it with "leafproxy tag add NAME --step 1000" (proxies see new tags within 60 s), or add it to snowflake-tags to serve it from the snowflake engine.`},
		{"store down, buffers empty", fmt.Errorf("%w: tag %q: both segments used up and the last load failed: %w", idgen.ErrUnavailable, "audit", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")), "audit", "58000",
			`cannot issue an ID of tag "audit" now: the ID source is unavailable`,
			`Tag "audit": both segments used up and the last load failed: dial tcp 127.0.0.1:5432: connect: connection refused.`,
			`Retry in a moment; the proxy keeps trying to reach its store (see /readyz and the status page).`},
		{"clock backwards", fmt.Errorf("%w: by 20ms (the engine waits out at most 5ms)", idgen.ErrClockBackwards), "snow", "55000",
			`cannot issue an ID of snowflake tag "snow": the system clock moved backwards`,
			`By 20ms (the engine waits out at most 5ms).`,
			`Retry in a moment; if it repeats, check the time synchronisation (NTP) of the proxy's host.`},
		{"worker not held", fmt.Errorf("%w: the lease on worker %d could not be renewed", idgen.ErrWorkerNotHeld, 7), "", "55000",
			`cannot issue a snowflake ID: this proxy does not hold its snowflake worker ID now`,
			`The lease on worker 7 could not be renewed.`,
			`Retry in a moment; the proxy is renewing or acquiring its worker ID (see /readyz and the status page).`},
		{"engine closed", fmt.Errorf("snowflake: engine not started or closed: %w", idgen.ErrUnavailable), "", "58000",
			`cannot issue a snowflake ID now: the ID source is unavailable`,
			`Engine not started or closed.`,
			`Retry in a moment; the proxy keeps trying to reach its store (see /readyz and the status page).`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &idSource{router: idgen.NewRouter(errGen{tc.err}, errGen{tc.err}, []string{"snow"})}
			var err error
			if tc.tag == "" {
				_, err = src.NextSnowflake(ctx)
			} else {
				_, err = src.Next(ctx, tc.tag)
			}
			var e *idError
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v", err, err)
			}
			if e.SQLState() != tc.state || e.Error() != tc.msg || e.Detail() != tc.detail || e.Hint() != tc.hint {
				t.Errorf("\n got %s %q\n     DETAIL %q\n     HINT %q\nwant %s %q\n     DETAIL %q\n     HINT %q",
					e.SQLState(), e.Error(), e.Detail(), e.Hint(), tc.state, tc.msg, tc.detail, tc.hint)
			}
			for _, s := range []string{e.Error(), e.Detail()} {
				if strings.Contains(s, "idgen") || strings.Contains(s, "segment:") || strings.Contains(s, "snowflake:") {
					t.Errorf("%q shows a Go package name", s)
				}
			}
		})
	}
}
