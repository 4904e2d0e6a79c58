package proxy

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
	"github.com/leafproxy/leafproxy/proxy/pool"
)

// BenchmarkTxPoolPgbenchCPU runs pgbench (select-only, 50 clients, 10 s) through a
// transaction pool of 20 server connections and reports the proxy's CPU time per
// transaction: the user and system time of this process (pgbench and PostgreSQL are
// other processes) over the transactions pgbench made.
//
//	go test -run '^$' -bench TxPoolPgbenchCPU -benchtime 1x ./proxy/
func BenchmarkTxPoolPgbenchCPU(b *testing.B) {
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		if os.Getenv("CI") != "" {
			b.Fatal(err)
		}
		b.Skip(err)
	}
	db := testenv.NewDatabase(b)
	p := startProxy(b, db, func(s *Server) {
		s.PoolMode = PoolTransaction
		s.Pooling = pool.Settings{Limits: pool.Limits{PoolSize: 20, QueryWaitTimeout: time.Minute}}
	})
	if out, err := exec.Command(pgbench, "-i", "-s", "1", "-q", db).CombinedOutput(); err != nil {
		b.Fatalf("pgbench -i: %v\n%s", err, out)
	}
	for _, mode := range []string{"simple", "extended", "prepared"} {
		b.Run(mode, func(b *testing.B) {
			var txs, cpu float64
			for range b.N {
				before := processCPU()
				out, err := exec.Command(pgbench, "-n", "-S", "-M", mode, "-c", "50", "-j", "2", "-T", "10", p.url(db)).CombinedOutput()
				if err != nil {
					b.Fatalf("pgbench: %v\n%s", err, out)
				}
				cpu += (processCPU() - before).Seconds()
				m := pgbenchProcessed.FindSubmatch(out)
				if m == nil {
					b.Fatalf("no transaction count in:\n%s", out)
				}
				n, _ := strconv.Atoi(string(m[1]))
				txs += float64(n)
			}
			b.ReportMetric(txs/float64(b.N)/10, "tps")
			b.ReportMetric(cpu/txs*1e6, "proxy-cpu-µs/tx")
		})
	}
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
