package segment

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/leafproxy/leafproxy/idgen"
)

// Refresh reloads the tag list from the store now: new rows become usable and tags whose
// row is gone answer idgen.ErrUnknownTag. Tags that stay keep their buffered segments.
// The engine calls it every RefreshInterval; call it yourself after adding a tag when even
// the on-demand reload (see Settings.MissRefresh) is not soon enough.
func (e *Engine) Refresh(ctx context.Context) error {
	began := time.Now()
	tags, err := e.store.Tags(ctx)
	if err == nil {
		err = e.setTags(tags)
	}
	if e.hooks.OnRefresh != nil {
		e.hooks.OnRefresh(len(tags), time.Since(began), err)
	}
	if err != nil {
		return fmt.Errorf("%w: segment: reload tags: %w", idgen.ErrUnavailable, err)
	}
	return nil
}

func (e *Engine) setTags(tags []string) error {
	e.refreshMu.Lock()
	defer e.refreshMu.Unlock()
	if e.state.Load() == stateClosed {
		return ErrClosed
	}
	old := *e.tags.Load()
	m := make(map[string]*tagBuffer, len(tags))
	var added []string
	for _, t := range tags {
		if tb := old[t]; tb != nil {
			m[t] = tb
		} else {
			m[t] = newTagBuffer(t)
			added = append(added, t)
		}
	}
	var removed []string
	for t, tb := range old {
		if _, ok := m[t]; !ok {
			tb.remove()
			removed = append(removed, t)
		}
	}
	e.tags.Store(&m)
	if len(added) > 0 || len(removed) > 0 {
		e.log.WithFields(map[string]any{"added": added, "removed": removed, "tags": len(m)}).Info("tag list changed")
	}
	return nil
}

// dropTag removes tb from the tag map after the store said its row is gone.
func (e *Engine) dropTag(tb *tagBuffer) {
	e.refreshMu.Lock()
	defer e.refreshMu.Unlock()
	old := *e.tags.Load()
	if old[tb.tag] != tb {
		return
	}
	m := maps.Clone(old)
	delete(m, tb.tag)
	tb.remove()
	e.tags.Store(&m)
	e.log.WithField("tag", tb.tag).Info("tag removed: its leaf_alloc row is gone")
}

func (e *Engine) refreshLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.refreshInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(e.ctx, e.loadTimeout)
		if err := e.Refresh(ctx); err != nil && e.state.Load() == stateRunning {
			e.log.WithError(err).Warn("reloading the tag list failed; keeping the old one")
		}
		cancel()
	}
}

// nextUnknown handles a tag missing from the map: the engine is not running, the argument
// is bad, or the tag was created after the last refresh. For the last case it reloads the
// list, at most once per MissRefresh so that a client asking for nonsense tags cannot turn
// every call into a query.
func (e *Engine) nextUnknown(ctx context.Context, tag string) (int64, error) {
	switch {
	case e.state.Load() != stateRunning:
		return 0, fmt.Errorf("%w: segment engine not running", idgen.ErrUnavailable)
	case tag == "":
		return 0, fmt.Errorf("%w: empty tag", idgen.ErrBadArgument)
	case e.missRefresh < 0:
		return 0, fmt.Errorf("%w: %q", idgen.ErrUnknownTag, tag)
	}
	select {
	case e.missSem <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: tag %q: %w", idgen.ErrUnavailable, tag, ctx.Err())
	}
	tb := (*e.tags.Load())[tag] // a refresh that ran while we waited may have brought it
	var err error
	if tb == nil {
		if time.Since(e.lastMiss) >= e.missRefresh {
			err = e.Refresh(ctx)
			// A reload cut short by this caller's deadline says nothing about the store;
			// it does not count against the rate limit.
			if ctx.Err() == nil {
				e.lastMiss, e.missErr = time.Now(), err
			}
		} else {
			err = e.missErr
		}
		tb = (*e.tags.Load())[tag]
	}
	<-e.missSem
	switch {
	case tb != nil:
		return e.Next(ctx, tag)
	case err != nil:
		// We cannot tell whether the tag exists: the store is down.
		return 0, fmt.Errorf("tag %q: %w", tag, err)
	default:
		return 0, fmt.Errorf("%w: %q", idgen.ErrUnknownTag, tag)
	}
}

func sortedKeys(m map[string]*tagBuffer) []string {
	return slices.Sorted(maps.Keys(m))
}
