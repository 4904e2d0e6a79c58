package main

import (
	"context"
	"time"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/metrics"
)

// The runway reader's queries: one row per tag, and one count over the 1024 lease rows,
// both cheap enough to run every interval. A row is free when it was released or its lease
// expired, the same test Acquire uses.
const (
	sqlRunwayTags    = `SELECT biz_tag, max_id FROM leaf_alloc`
	sqlRunwayWorkers = `SELECT count(*) FILTER (WHERE expires_at <= now()), count(*) FROM leaf_worker_lease`
)

// newRunway builds the reader of the runway figures (segment tags against their key types,
// the snowflake time bits, the lease table's free worker IDs) and registers its gauges.
func (a *app) newRunway() *metrics.Runway {
	kinds := make(map[string]metrics.KeyType, len(a.cfg.TagKeyTypes))
	def := metrics.KeyBigint
	for tag, kt := range a.cfg.TagKeyTypes {
		if tag == config.AnyTag {
			def = kt
			continue
		}
		kinds[tag] = kt
	}
	s := metrics.RunwaySettings{
		ReadTags:       a.readTagMax,
		KeyTypes:       kinds,
		DefaultKeyType: def,
	}
	if probe := a.storeProbe; probe != nil {
		// The store probe checks every few seconds and is what /readyz and the status page
		// say; leafproxy_store_up agrees with them.
		s.StoreState = func() (bool, bool) { st := probe.State(); return st.Checked, st.OK }
	}
	if a.snowflake != nil {
		codec := a.snowflake.Codec()
		s.SnowflakeEnd = time.UnixMilli(codec.EpochMillis() + codec.Layout().MaxElapsed() + 1)
	}
	if a.cfg.WorkerSource == config.WorkerPostgres {
		s.ReadWorkers = a.readFreeWorkers
	}
	return a.metrics.NewRunway(s)
}

func (a *app) readTagMax(ctx context.Context) ([]metrics.TagMax, error) {
	rows, err := a.pool.Query(ctx, sqlRunwayTags)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []metrics.TagMax
	for rows.Next() {
		var tm metrics.TagMax
		if err := rows.Scan(&tm.Tag, &tm.MaxID); err != nil {
			return nil, err
		}
		out = append(out, tm)
	}
	return out, rows.Err()
}

func (a *app) readFreeWorkers(ctx context.Context) (free, capacity int64, err error) {
	err = a.pool.QueryRow(ctx, sqlRunwayWorkers).Scan(&free, &capacity)
	return free, capacity, err
}
