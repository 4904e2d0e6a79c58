package idgen

import (
	"context"
	"fmt"
)

// Router sends tags listed in SnowflakeTags to Snowflake and every other tag to Segment.
// It holds no state of its own; build it once and share it.
type Router struct {
	Segment       Generator
	Snowflake     Generator
	SnowflakeTags map[string]bool
}

// NewRouter returns a Router for the given snowflake tags. Either engine may be nil when
// it is not configured; asking it for an ID then fails with ErrUnavailable.
func NewRouter(segment, snowflake Generator, snowflakeTags []string) *Router {
	tags := make(map[string]bool, len(snowflakeTags))
	for _, t := range snowflakeTags {
		tags[t] = true
	}
	return &Router{Segment: segment, Snowflake: snowflake, SnowflakeTags: tags}
}

// IsSnowflake reports whether tag is served by the snowflake engine.
func (r *Router) IsSnowflake(tag string) bool { return r.SnowflakeTags[tag] }

// engine returns the engine that serves tag, nil when it is not configured.
func (r *Router) engine(tag string) Generator {
	if r.SnowflakeTags[tag] {
		return r.Snowflake
	}
	return r.Segment
}

// Next returns the next ID of tag from its engine.
func (r *Router) Next(ctx context.Context, tag string) (int64, error) {
	if tag == "" {
		return 0, fmt.Errorf("%w: empty tag", ErrBadArgument)
	}
	g := r.engine(tag)
	if g == nil {
		return 0, fmt.Errorf("%w: no engine configured for tag %q", ErrUnavailable, tag)
	}
	return g.Next(ctx, tag)
}

// NextSnowflake returns a snowflake ID whatever the tag (leaf_snowflake(), and Leaf's
// snowflake HTTP endpoint, which ignores its key).
func (r *Router) NextSnowflake(ctx context.Context) (int64, error) {
	if r.Snowflake == nil {
		return 0, fmt.Errorf("%w: snowflake engine not configured", ErrUnavailable)
	}
	return r.Snowflake.Next(ctx, "")
}

// TryNext returns an ID of tag from its engine if the engine has one at hand now, without
// waiting (see TryGenerator). ok is false, and nothing is counted, for an empty tag, an
// engine that is not configured or does not implement TryGenerator, and wherever the
// engine's Next would wait or fail: the caller then calls Next.
func (r *Router) TryNext(tag string) (id int64, ok bool) {
	if tag == "" {
		return 0, false
	}
	return TryNext(r.engine(tag), tag)
}

// TryNextSnowflake is NextSnowflake without waiting, as TryNext is Next.
func (r *Router) TryNextSnowflake() (id int64, ok bool) {
	return TryNext(r.Snowflake, "")
}
