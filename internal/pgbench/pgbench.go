// Package pgbench compares the throughput of PostgreSQL endpoints (the database itself,
// leafproxy, PgBouncer) with the pgbench program, and prints the comparison as a markdown
// table with each endpoint's ratio to a baseline.
//
// A comparison is a list of Groups. Each group names a workload and the endpoints that
// run it; the first endpoint is the baseline. Later comparisons (leaf_next against
// nextval, a proxy-filled INSERT against a bigserial default) are further groups whose
// endpoints run different scripts.
package pgbench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Modes are pgbench's protocol modes (-M).
var Modes = []string{"simple", "extended", "prepared"}

// Endpoint is one column of a group: a server address and what pgbench runs there.
type Endpoint struct {
	Name string // column name: "direct", "proxy", "pgbouncer"
	URL  string
	// Script is a custom pgbench script (-f); empty means Args alone select the workload.
	Script string
	Args   []string // further pgbench arguments, e.g. "-S"
	// CPU, when set, reads the cumulative CPU time of the hop in front of the database
	// (the proxy or PgBouncer process). Its growth over a run, divided by the
	// transactions, is the hop's own cost per transaction: a figure that, unlike TPS,
	// does not depend on how many cores pgbench and the server leave it.
	CPU func() (time.Duration, error)
	// Rival, when set, names another endpoint of the group, also with a CPU meter, that
	// the table compares this one's CPU per transaction with round by round (leafproxy
	// with PgBouncer, say; see pairedCell).
	Rival string
	// Units is how many units of work (IDs, say) one transaction of the script does; when
	// set, ratios compare TPS × Units, so that a batch of 1,000 IDs per transaction is
	// compared by IDs per second with one ID per transaction.
	Units int
	// Unsupported names the protocol modes the endpoint cannot run, each with the reason
	// the table prints in place of its figures (PgBouncer in transaction mode and
	// pgbench -M prepared, say); those runs are left out.
	Unsupported map[string]string
	// During, when set, runs alongside each of the endpoint's pgbench runs (to take a CPU
	// profile of the hop, say), given the run's length and a name unique to the run
	// ("tx-pool-extended-200c-r2"); the run waits for it, and its error fails the run.
	During func(ctx context.Context, run string, d time.Duration) error
}

func (e Endpoint) units() float64 { return float64(max(e.Units, 1)) }

// Group is one workload compared across endpoints; Endpoints[0] is the baseline.
type Group struct {
	Name      string
	Endpoints []Endpoint
	// Prepare, when set, runs before the group's first run (to change a server setting,
	// say); the function it returns runs after the group's last run.
	Prepare func(context.Context) (restore func() error, err error)
	// Clients, Modes and Duration, when set, replace the Config's for this group.
	Clients  []int
	Modes    []string
	Duration time.Duration
	// Transactions, when set, makes each client run this many transactions (pgbench -t)
	// instead of running for a duration: with -t 1, every client connects, runs one
	// transaction and leaves, so that the CPU per transaction is the cost of a login.
	Transactions int
}

// Config says how long and how wide each run is.
type Config struct {
	Pgbench  string        // path of pgbench; "" finds it in PATH
	Duration time.Duration // per run (-T)
	Clients  []int         // client counts (-c), one row each
	Modes    []string      // protocol modes (-M); nil means Modes
	// Rounds repeats each row this many times, endpoints interleaved, and reports the
	// median TPS, so that a noisy machine skews every endpoint alike (default 1).
	Rounds int
	Log    func(format string, args ...any)
}

// Result is the outcome of one pgbench run.
type Result struct {
	Group, Endpoint, Mode string
	Clients               int
	TPS                   float64
	Failed                int
	Transactions          int64         // transactions pgbench completed
	HopCPU                time.Duration // CPU time the endpoint's CPU meter grew by; 0 without one
	MachineCPU            time.Duration // busy CPU time of the whole machine over the run (MachineCPU)
	// RoundsPerTx, set on a row's median when the hop has a CPU meter, holds every
	// round's CPU per transaction in ascending order. The CPU figure of the row is their
	// own median, not the CPU of the round with the median TPS: CPU per transaction is
	// the figure the hops are compared by, and a round disturbed by other work on the
	// machine moves TPS and CPU differently.
	RoundsPerTx []time.Duration
	// ByRound holds the same figures in the order of the rounds, so that two hops can be
	// compared round by round (see pairedCell).
	ByRound []time.Duration
}

// CPUPerTx is the hop's CPU time per transaction (over the rounds, their median), 0
// when unknown.
func (r Result) CPUPerTx() time.Duration {
	if n := len(r.RoundsPerTx); n > 0 {
		return r.RoundsPerTx[n/2]
	}
	return r.perTx()
}

func (r Result) perTx() time.Duration {
	if r.Transactions <= 0 {
		return 0
	}
	return r.HopCPU / time.Duration(r.Transactions)
}

var (
	// pgbench -C counts the connections in: "(including reconnection times)".
	tpsRe    = regexp.MustCompile(`tps = ([0-9.]+) \((?:without initial connection time|including reconnection times)\)`)
	failedRe = regexp.MustCompile(`number of failed transactions: (\d+)`)
	txRe     = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
)

// Run runs every group for every mode and client count. Within one row, endpoints run
// one after the other, so that drift of the machine affects them alike.
func Run(ctx context.Context, cfg Config, groups []Group) ([]Result, error) {
	bin := cfg.Pgbench
	if bin == "" {
		p, err := exec.LookPath("pgbench")
		if err != nil {
			return nil, fmt.Errorf("pgbench not installed: %w", err)
		}
		bin = p
	}
	modes := cfg.Modes
	if modes == nil {
		modes = Modes
	}
	dir, err := os.MkdirTemp("", "leafproxy-pgbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var results []Result
	for _, g := range groups {
		rs, err := runGroup(ctx, cfg, bin, dir, g, modes)
		results = append(results, rs...)
		if err != nil {
			return results, err
		}
	}
	return results, nil
}

// runGroup runs one group for every mode and client count, between its Prepare and the
// restore function Prepare returned.
func runGroup(ctx context.Context, cfg Config, bin, dir string, g Group, modes []string) (results []Result, err error) {
	if g.Prepare != nil {
		restore, err := g.Prepare(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: prepare: %w", g.Name, err)
		}
		defer func() {
			if rerr := restore(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("%s: restore: %w", g.Name, rerr))
			}
		}()
	}
	rounds := max(cfg.Rounds, 1)
	duration := cfg.Duration
	if g.Duration > 0 {
		duration = g.Duration
	}
	clientCounts := cfg.Clients
	if g.Clients != nil {
		clientCounts = g.Clients
	}
	if g.Modes != nil {
		modes = g.Modes
	}
	for _, mode := range modes {
		for _, clients := range clientCounts {
			runs := make([][]Result, len(g.Endpoints))
			for round := range rounds {
				// Each round starts one endpoint further on, so that none always runs
				// right after the same neighbour (and its leftovers: a server still
				// checkpointing, a hop still freeing memory).
				for k := range g.Endpoints {
					i := (k + round) % len(g.Endpoints)
					e := g.Endpoints[i]
					if e.Unsupported[mode] != "" {
						continue
					}
					r, err := runOne(ctx, bin, dir, duration, g.Transactions, e, mode, clients,
						fmt.Sprintf("%s-%s-%dc-r%d", g.Name, mode, clients, round+1))
					if err != nil {
						return results, fmt.Errorf("%s/%s/%s/%d clients: %w", g.Name, e.Name, mode, clients, err)
					}
					r.Group = g.Name
					runs[i] = append(runs[i], r)
					if cfg.Log != nil {
						cfg.Log("%-12s %-9s %2d clients %-10s %10.0f tps (%d failed)%s",
							g.Name, mode, clients, e.Name, r.TPS, r.Failed, cpuNote(r))
					}
				}
			}
			for _, rs := range runs {
				if len(rs) > 0 {
					results = append(results, median(rs))
				}
			}
		}
	}
	return results, nil
}

// median returns the run with the median TPS, its failures summed over all runs and,
// when the runs measured the hop's CPU, every run's CPU per transaction (see
// Result.RoundsPerTx).
func median(rs []Result) Result {
	sorted := slices.Clone(rs)
	slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.TPS, b.TPS) })
	m := sorted[len(sorted)/2]
	m.Failed = 0
	m.RoundsPerTx, m.ByRound = nil, nil
	for _, r := range rs {
		m.Failed += r.Failed
		if r.HopCPU > 0 {
			m.ByRound = append(m.ByRound, r.perTx())
		}
	}
	m.RoundsPerTx = slices.Sorted(slices.Values(m.ByRound))
	return m
}

// runOne runs pgbench once: for d, or tx transactions per client when tx is set.
func runOne(ctx context.Context, bin, dir string, d time.Duration, tx int, e Endpoint, mode string, clients int, run string) (Result, error) {
	threads := min(clients, runtime.NumCPU())
	args := []string{"-n", "-M", mode, "-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads)}
	if tx > 0 {
		args = append(args, "-t", strconv.Itoa(tx))
	} else {
		args = append(args, "-T", strconv.Itoa(int(d.Round(time.Second)/time.Second)))
	}
	args = append(args, e.Args...)
	if e.Script != "" {
		file := filepath.Join(dir, e.Name+".sql")
		if err := os.WriteFile(file, []byte(e.Script), 0o644); err != nil {
			return Result{}, err
		}
		args = append(args, "-f", file)
	}
	args = append(args, e.URL)
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	machineBefore, err := MachineCPU()
	if err != nil {
		return Result{}, fmt.Errorf("machine cpu meter: %w", err)
	}
	var before time.Duration
	if e.CPU != nil {
		if before, err = e.CPU(); err != nil {
			return Result{}, fmt.Errorf("cpu meter: %w", err)
		}
	}
	var during chan error
	if e.During != nil {
		during = make(chan error, 1)
		go func() { during <- e.During(ctx, run, d) }()
	}
	err = cmd.Run()
	machineAfter, merr := MachineCPU()
	if during != nil {
		if derr := <-during; derr != nil && err == nil {
			return Result{}, fmt.Errorf("%s: %w", run, derr)
		}
	}
	if err != nil {
		return Result{}, fmt.Errorf("%w\n%s", err, out.String())
	}
	if merr != nil {
		return Result{}, fmt.Errorf("machine cpu meter: %w", merr)
	}
	r, err := parse(out.String(), e.Name, mode, clients)
	r.MachineCPU = machineAfter - machineBefore
	if err != nil || e.CPU == nil {
		return r, err
	}
	after, err := e.CPU()
	if err != nil {
		return r, fmt.Errorf("cpu meter: %w", err)
	}
	r.HopCPU = after - before
	return r, nil
}

func parse(out, endpoint, mode string, clients int) (Result, error) {
	r := Result{Endpoint: endpoint, Mode: mode, Clients: clients}
	m := tpsRe.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("no tps in pgbench output:\n%s", out)
	}
	tps, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return r, err
	}
	r.TPS = tps
	if m := failedRe.FindStringSubmatch(out); m != nil {
		r.Failed, _ = strconv.Atoi(m[1])
	}
	if m := txRe.FindStringSubmatch(out); m != nil {
		r.Transactions, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return r, nil
}

// Table renders results as a markdown table: one row per group, mode and client count,
// and per endpoint its TPS and, after the baseline, its ratio to the baseline.
func Table(groups []Group, results []Result) string {
	var b strings.Builder
	for _, g := range groups {
		if len(g.Endpoints) == 0 {
			continue
		}
		base := g.Endpoints[0].Name
		baseCPU := g.Endpoints[0].CPU != nil
		fmt.Fprintf(&b, "\n| %s | mode | clients | %s TPS |", g.Name, base)
		if baseCPU {
			fmt.Fprintf(&b, " %s CPU µs/tx |", base)
		}
		for _, e := range g.Endpoints[1:] {
			fmt.Fprintf(&b, " %s TPS | %s / %s |", e.Name, e.Name, base)
			if e.CPU != nil {
				fmt.Fprintf(&b, " %s CPU µs/tx |", e.Name)
			}
		}
		pairs := cpuPairs(g.Endpoints)
		for _, p := range pairs {
			fmt.Fprintf(&b, " %s / %s CPU per round |", p[0], p[1])
		}
		b.WriteString("\n|---|---|---:|---:|")
		if baseCPU {
			b.WriteString("---:|")
		}
		for _, e := range g.Endpoints[1:] {
			b.WriteString("---:|---:|")
			if e.CPU != nil {
				b.WriteString("---:|")
			}
		}
		b.WriteString(strings.Repeat("---:|", len(pairs)))
		b.WriteString("\n")
		type key struct {
			mode    string
			clients int
		}
		var order []key
		byKey := map[key]map[string]Result{}
		for _, r := range results {
			if r.Group != g.Name {
				continue
			}
			k := key{r.Mode, r.Clients}
			if byKey[k] == nil {
				byKey[k] = map[string]Result{}
				order = append(order, k)
			}
			byKey[k][r.Endpoint] = r
		}
		for _, k := range order {
			row := byKey[k]
			baseTPS := row[base].TPS
			baseUnits := g.Endpoints[0].units()
			fmt.Fprintf(&b, "| | %s | %d | %.0f%s |", k.mode, k.clients, baseTPS, failedNote(row[base]))
			if baseCPU {
				fmt.Fprintf(&b, " %s |", cpuCell(row[base]))
			}
			for _, e := range g.Endpoints[1:] {
				r, ok := row[e.Name]
				if note := e.Unsupported[k.mode]; !ok && note != "" {
					fmt.Fprintf(&b, " %s | – |", note)
					if e.CPU != nil {
						b.WriteString(" – |")
					}
					continue
				}
				if !ok {
					b.WriteString(" – | – |")
					if e.CPU != nil {
						b.WriteString(" – |")
					}
					continue
				}
				ratio := 0.0
				if baseTPS > 0 {
					ratio = r.TPS * e.units() / (baseTPS * baseUnits)
				}
				fmt.Fprintf(&b, " %.0f%s | %.2f× |", r.TPS, failedNote(r), ratio)
				if e.CPU != nil {
					fmt.Fprintf(&b, " %s |", cpuCell(r))
				}
			}
			for _, p := range pairs {
				fmt.Fprintf(&b, " %s |", pairedCell(row[p[0]], row[p[1]]))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// cpuPairs names the hops whose CPU the table compares round by round: each endpoint
// with a Rival, and the rival.
func cpuPairs(endpoints []Endpoint) [][2]string {
	var pairs [][2]string
	for _, e := range endpoints {
		if e.Rival != "" {
			pairs = append(pairs, [2]string{e.Name, e.Rival})
		}
	}
	return pairs
}

// pairedCell compares the CPU per transaction of hops a and b round by round, each
// round's ratio taken between runs made one after the other, which a machine whose
// load drifts over minutes disturbs less than it does the two medians: the median of
// the ratios, their range, and in how many rounds a cost less. "–" when the rounds do
// not pair up (a hop that cannot run the mode).
func pairedCell(a, b Result) string {
	n := len(a.ByRound)
	if n == 0 || len(b.ByRound) != n {
		return "–"
	}
	ratios := make([]float64, n)
	less := 0
	for i := range n {
		if b.ByRound[i] <= 0 {
			return "–"
		}
		ratios[i] = float64(a.ByRound[i]) / float64(b.ByRound[i])
		if ratios[i] < 1 {
			less++
		}
	}
	slices.Sort(ratios)
	if n == 1 {
		return fmt.Sprintf("%.2f×", ratios[0])
	}
	return fmt.Sprintf("%.2f× (%.2f–%.2f), less in %d of %d", ratios[n/2], ratios[0], ratios[n-1], less, n)
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// cpuCell is the CPU per transaction of a row in µs, with the range over the rounds
// when there were several: "13.6 (12.4–14.2)".
func cpuCell(r Result) string {
	cell := fmt.Sprintf("%.1f", us(r.CPUPerTx()))
	if n := len(r.RoundsPerTx); n > 1 {
		cell += fmt.Sprintf(" (%.1f–%.1f)", us(r.RoundsPerTx[0]), us(r.RoundsPerTx[n-1]))
	}
	return cell
}

// cpuNote is a run's CPU per transaction for its log line: the hop's, when it has a
// meter, and the whole machine's (see MachineCPU).
func cpuNote(r Result) string {
	var note string
	if r.HopCPU != 0 {
		note = fmt.Sprintf(", %.1f µs CPU/tx in the hop", us(r.CPUPerTx()))
	}
	if r.MachineCPU > 0 && r.Transactions > 0 {
		note += fmt.Sprintf(", %.0f µs CPU/tx in the machine", us(r.MachineCPU/time.Duration(r.Transactions)))
	}
	return note
}

func failedNote(r Result) string {
	if r.Failed == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d failed)", r.Failed)
}
