package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/leafproxy/leafproxy/internal/config"
	"github.com/leafproxy/leafproxy/internal/filladmin"
	"github.com/leafproxy/leafproxy/rewrite"
)

// This file keeps the proxy's fill rules current: those of the configuration merged with
// those of the store's leaf_fill, read at start, every fill-refresh and on SIGHUP. A new
// rule set is applied by swapping in a new Rewriter (proxy.Server.SetRewriter), so it
// takes effect at once for every session. A set that cannot be applied (a conflict, the
// store unreachable) is logged and the rules in use are kept.

// fillRules is the rule set in use.
type fillRules struct {
	mu       sync.Mutex
	rules    []config.FillRule
	noSchema bool // leaf_fill was missing at the last read (warned once)
	unread   bool // the last read of the store failed: retried every fillRetry
}

func (f *fillRules) current() []config.FillRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rules
}

const (
	// fillReadTimeout bounds one read of leaf_fill by the refresh.
	fillReadTimeout = 10 * time.Second
	// fillStartTimeout bounds the read at start, which holds up accepting clients: a
	// store that is slow or down delays the start by this much at most, and the proxy
	// starts with its configuration's rules. The store has just answered connectStore,
	// so a read that takes long is one on a loaded machine or store, not one that will
	// never come: it gets as long as a refresh's, since until it is in, a table whose rule
	// is stored alone takes INSERTs without its key filled.
	fillStartTimeout = fillReadTimeout
	// fillRetry is how soon a failed read of the store is tried again, so that a proxy
	// started while the store was down gets the stored rules soon after it is back.
	fillRetry = 2 * time.Second
)

// newRewriter builds the rewriter for a rule set, with the catalog of the tables it fills
// read again for it (catalogRules).
func (a *app) newRewriter(rules []config.FillRule) (*rewrite.Rewriter, error) {
	fill, cat, err := a.catalogRules(rules)
	if err != nil {
		return nil, err
	}
	codec := a.snowflake.Codec()
	return rewrite.New(rewrite.Settings{Fill: fill, Catalog: cat, Snowflake: rewrite.SnowflakeLayout{
		EpochMillis: codec.EpochMillis(), WorkerBits: codec.Layout().WorkerBits, SequenceBits: codec.Layout().SequenceBits,
	}})
}

// loadFillRules reads leaf_fill and merges it with the configuration's rules. A store
// without leaf_fill (not migrated to version 3) has no rules.
func (a *app) loadFillRules(ctx context.Context, timeout time.Duration) ([]config.FillRule, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stored, err := filladmin.List(ctx, a.pool)
	noSchema := errors.Is(err, filladmin.ErrNoSchema)
	if noSchema {
		stored, err = nil, nil
	}
	a.fill.mu.Lock()
	warn := noSchema && !a.fill.noSchema
	a.fill.noSchema = noSchema
	a.fill.unread = err != nil
	a.fill.mu.Unlock()
	if warn {
		a.log.Warn("the store has no leaf_fill table (run `leafproxy migrate up`): only the fill rules of the configuration apply")
	}
	if err != nil {
		return nil, err
	}
	return config.MergeFillRules(config.Sourced(a.cfg.FillRules, "config"), config.Sourced(stored, "store leaf_fill"))
}

// initialFillRules returns the rules to start with: the merged set, or the
// configuration's alone when the store's cannot be read or merged (logged; the next
// refresh tries again).
func (a *app) initialFillRules(ctx context.Context) []config.FillRule {
	rules, err := a.loadFillRules(ctx, fillStartTimeout)
	if err != nil {
		a.log.WithError(err).Error("fill rules of the store not applied: starting with the fill rules of the configuration only")
		rules = a.cfg.FillRules
	}
	a.fill.mu.Lock()
	a.fill.rules = rules
	a.fill.mu.Unlock()
	return rules
}

// refreshFill reads the rules again and applies them when they changed. On any error the
// rules in use stay.
func (a *app) refreshFill(ctx context.Context, why string) {
	log := a.log.WithField("trigger", why)
	rules, err := a.loadFillRules(ctx, fillReadTimeout)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case why == "retry": // the store is still down: said at the first failure
			log.WithError(err).Debug("fill rules not reloaded: keeping the rules in use")
		default:
			log.WithError(err).Error("fill rules not reloaded: keeping the rules in use")
		}
		return
	}
	a.fill.mu.Lock()
	defer a.fill.mu.Unlock()
	if slices.Equal(rules, a.fill.rules) {
		log.Debug("fill rules unchanged")
		return
	}
	rw, err := a.newRewriter(rules)
	if err == nil {
		err = a.proxy.SetRewriter(rw)
	}
	if err != nil {
		log.WithError(err).Error("fill rules not applied: keeping the rules in use")
		return
	}
	a.fill.rules = rules
	a.mu.Lock()
	a.rewriter = rw // the one the catalog refresh tells of changed columns
	a.mu.Unlock()
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.String()
	}
	log.WithField("fill_rules", names).Info("fill rules applied")
}

// watchFill refreshes the fill rules every fill-refresh and on every signal on hup, and
// every fillRetry while the store cannot be read. A signal on hup (SIGHUP) first reloads
// the databases (reloadDatabases).
func (a *app) watchFill(ctx context.Context, hup <-chan os.Signal) {
	t := time.NewTicker(a.cfg.FillRefresh)
	defer t.Stop()
	retry := time.NewTimer(fillRetry)
	defer retry.Stop()
	for {
		a.fill.mu.Lock()
		unread := a.fill.unread
		a.fill.mu.Unlock()
		var retryC <-chan time.Time
		if unread {
			retry.Reset(fillRetry)
			retryC = retry.C
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.refreshFill(ctx, "interval")
		case <-hup:
			a.reloadDatabases()
			a.refreshFill(ctx, "SIGHUP")
		case <-retryC:
			a.refreshFill(ctx, "retry")
		}
	}
}

// notifyHangup starts catching SIGHUP, which would otherwise end the process, and
// returns the channel and the function that stops catching it.
func notifyHangup() (<-chan os.Signal, func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}
