package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lib/pq"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// Transaction pooling through the real binary: real clients, ten times as many sessions
// as the pool has server connections, the proxy authenticating them itself (SCRAM from an
// auth file) and logging into PostgreSQL with what they proved.

const (
	txPoolSize = 5       // --pool-size
	txClients  = 50      // client sessions open at once
	txSegTag   = "txseg" // a segment tag; snowOrder is the snowflake tag
)

// txPool is one leafproxy in transaction mode in front of a database of its own.
type txPool struct {
	*Proxy
	dsn string // the database, straight, as the superuser
	url string // the database through the proxy, as testenv.SCRAMUser with its password
}

// startTxPool creates a database with the Leaf schema, the segment tag txSegTag and the
// tables of ddl (readable and writable by testenv.SCRAMUser), and starts leafproxy with
// --pool-mode transaction --pool-size 5, SCRAM authentication at the proxy from an auth
// file, snowflake tag snowOrder and the fill rules given.
func startTxPool(t *testing.T, name string, workerID int, fill []string, ddl ...string) *txPool {
	t.Helper()
	requireServeFlags(t, "pool-mode", "pool-size", "auth-type", "auth-file", "snowflake-tags", "fill")
	dsn := testenv.NewDatabase(t)
	migrateUp(t, dsn)
	addTag(t, dsn, txSegTag, 1000)
	for _, s := range ddl {
		execSQL(t, dsn, s)
	}
	execSQL(t, dsn, "GRANT ALL ON ALL TABLES IN SCHEMA public TO "+testenv.SCRAMUser)
	secret := queryText(t, dsn, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", testenv.SCRAMUser)
	authFile := filepath.Join(t.TempDir(), "userlist.txt")
	if err := os.WriteFile(authFile, []byte(fmt.Sprintf("%q %q\n", testenv.SCRAMUser, secret)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := StartProxy(t, name, ProxyConfig{
		WorkerSource:  "static",
		WorkerID:      workerID,
		Upstream:      hostPort(t, dsn),
		Store:         dsn,
		SnowflakeTags: []string{snowOrder},
		Fill:          fill,
		Extra: []string{
			"--pool-mode", "transaction", "--pool-size", strconv.Itoa(txPoolSize),
			"--auth-type", "scram-sha-256", "--auth-file", authFile,
		},
	})
	return &txPool{Proxy: p, dsn: dsn, url: p.URL(dsn, testenv.SCRAMUser, testenv.SCRAMPassword)}
}

// queryText returns one text value straight from PostgreSQL.
func queryText(t testing.TB, dsn, sql string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// poolFigures is one entry of the proxy's /pools.
type poolFigures struct {
	Database  string        `json:"database"`
	User      string        `json:"user"`
	Active    int           `json:"cl_active"`
	Waiting   int           `json:"cl_waiting"`
	SvActive  int           `json:"sv_active"`
	SvIdle    int           `json:"sv_idle"`
	SvUsed    int           `json:"sv_used"`
	SvLogin   int           `json:"sv_login"`
	PoolSize  int           `json:"pool_size"`
	Acquires  uint64        `json:"acquires"`
	WaitTime  time.Duration `json:"total_wait_time_ns"`
	Xacts     uint64        `json:"total_xact_count"`
	Dials     uint64        `json:"dials"`
	Evictions uint64        `json:"evictions"`
}

// pools reads the proxy's /pools.
func (tp *txPool) pools(client *http.Client) ([]poolFigures, error) {
	resp, err := client.Get(tp.HTTPURL() + "/pools")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pools: %s", resp.Status)
	}
	var body struct {
		Pools []poolFigures `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET /pools: %w", err)
	}
	return body.Pools, nil
}

// serverWatch samples, from a direct connection, how many server connections
// PostgreSQL's pg_stat_activity shows for the pooled user while a load runs, and the
// proxy's /pools figures beside it.
type serverWatch struct {
	tp   *txPool
	stop chan struct{}
	done chan struct{}

	// Written by the sampling goroutine, read after done is closed.
	samples    int
	maxServers int
	over       []string // samples above the pool size
	maxWaiting int
	maxActive  int
	err        error
}

// watchServers starts sampling every 10 ms until Stop.
func watchServers(t *testing.T, tp *txPool) *serverWatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, tp.dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := &serverWatch{tp: tp, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(conn)
	t.Cleanup(func() {
		select {
		case <-w.stop:
		default:
			close(w.stop)
		}
		<-w.done
	})
	return w
}

func (w *serverWatch) run(conn *pgx.Conn) {
	defer close(w.done)
	defer conn.Close(context.Background())
	client := &http.Client{Timeout: 10 * time.Second}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND usename = $1`, testenv.SCRAMUser).Scan(&n)
		cancel()
		if err != nil {
			w.err = fmt.Errorf("pg_stat_activity: %w", err)
			return
		}
		w.samples++
		w.maxServers = max(w.maxServers, n)
		if n > txPoolSize {
			w.over = append(w.over, fmt.Sprintf("%d at %s", n, time.Now().Format("15:04:05.000")))
		}
		if pools, err := w.tp.pools(client); err == nil {
			for _, p := range pools {
				w.maxWaiting = max(w.maxWaiting, p.Waiting)
				w.maxActive = max(w.maxActive, p.Active)
			}
		}
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
	}
}

// Stop ends the sampling and fails the test when PostgreSQL ever showed more server
// connections of the pooled user than the pool allows, or never showed one.
func (w *serverWatch) Stop(t *testing.T, what string) {
	t.Helper()
	close(w.stop)
	<-w.done
	if w.err != nil {
		t.Fatal(w.err)
	}
	if len(w.over) > 0 {
		t.Errorf("%s: pg_stat_activity showed more server connections than --pool-size %d in %d samples: %s",
			what, txPoolSize, len(w.over), strings.Join(w.over[:min(len(w.over), 10)], ", "))
	}
	if w.maxServers == 0 {
		t.Errorf("%s: %d samples of pg_stat_activity never showed a server connection of %s", what, w.samples, testenv.SCRAMUser)
	}
	figures := ""
	if pools, err := w.tp.pools(&http.Client{Timeout: 10 * time.Second}); err == nil {
		for _, p := range pools {
			figures += fmt.Sprintf("; /pools %s/%s: %d acquires, %d transactions, %d dials, %v waited in all",
				p.Database, p.User, p.Acquires, p.Xacts, p.Dials, p.WaitTime.Round(time.Millisecond))
		}
	}
	t.Logf("FIGURE %s: at most %d server connections in %d samples of pg_stat_activity (pool-size %d); at most %d clients holding one and %d waiting%s",
		what, w.maxServers, w.samples, txPoolSize, w.maxActive, w.maxWaiting, figures)
}

// idSet checks that no ID is handed out twice, whichever way it came.
type idSet struct {
	mu   sync.Mutex
	seen map[int64]string
	dups []string
}

func newIDSet() *idSet { return &idSet{seen: map[int64]string{}} }

func (s *idSet) add(origin string, ids ...int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if prev, ok := s.seen[id]; ok {
			s.dups = append(s.dups, fmt.Sprintf("%d (%s, then %s)", id, prev, origin))
			continue
		}
		s.seen[id] = origin
	}
}

func (s *idSet) check(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.dups) > 0 {
		t.Fatalf("%d IDs handed out twice, e.g. %s", len(s.dups), strings.Join(s.dups[:min(len(s.dups), 10)], "; "))
	}
}

// checkStored checks the table against what the clients were told: exactly want rows,
// all with distinct IDs, every ID in rows among them and none of the IDs in gone.
func checkStored(t *testing.T, dsn, table string, want int, rows, gone []int64) {
	t.Helper()
	stored := queryInt64s(t, dsn, "SELECT id FROM "+table)
	have := make(map[int64]bool, len(stored))
	for _, id := range stored {
		if have[id] {
			t.Errorf("%s: ID %d stored twice", table, id)
		}
		have[id] = true
	}
	if len(stored) != want {
		t.Errorf("%s holds %d rows, want %d", table, len(stored), want)
	}
	missing := 0
	for _, id := range rows {
		if !have[id] {
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%s: %d of the %d IDs the clients read back name no stored row", table, missing, len(rows))
	}
	for _, id := range gone {
		if have[id] {
			t.Errorf("%s: ID %d of a rolled-back transaction is stored", table, id)
		}
	}
}

// sqlState is the SQLSTATE of an error from pgx or lib/pq, or "".
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		return string(pqErr.Code)
	}
	return ""
}

// TestTxPoolNodePg runs 50 node-postgres clients, all connected at once, over a pool of 5:
// filled INSERTs and leaf_next in simple queries, parameterised queries and named prepared
// statements, inside and outside transactions (half of them rolled back); a named
// statement is parsed once per client and then bound on whichever server connection
// each transaction gets, and one that fails with 22012 leaves the session usable, as do
// LISTEN and pg_advisory_lock($1), refused with 0A000.
func TestTxPoolNodePg(t *testing.T) {
	node, npm := nodeTools(t)
	dir := nodeDir(t)
	if !fileExists(filepath.Join(dir, "node_modules", "pg")) {
		runTool(t, dir, nil, npm, "ci", "--no-audit", "--no-fund")
	}
	tp := startTxPool(t, "txnode", 21, []string{"node_rows.id=" + txSegTag},
		`CREATE TABLE node_rows (id bigint PRIMARY KEY, client text NOT NULL, note text NOT NULL)`)
	const rounds = 4
	w := watchServers(t, tp)
	out := runTool(t, dir, []string{
		"DATABASE_URL=" + tp.url, "TABLE=node_rows", "TAG=" + txSegTag,
		"CLIENTS=" + strconv.Itoa(txClients), "ROUNDS=" + strconv.Itoa(rounds),
	}, node, "txpool.js")
	w.Stop(t, "node-postgres")

	ids := newIDSet()
	var rows, gone, next []int64
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		kind, num, ok := strings.Cut(line, " ")
		id, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			t.Fatalf("node printed %q", line)
		}
		switch kind {
		case "row":
			rows = append(rows, id)
		case "gone":
			gone = append(gone, id)
		case "next":
			next = append(next, id)
		default:
			t.Fatalf("node printed %q", line)
		}
		ids.add(kind, id)
	}
	// Per round: 3 rows outside a transaction, 3 in one (committed in even rounds), 1 in
	// a transaction that fails, 6 leaf_next IDs.
	wantRows, wantGone := txClients*(3*rounds+3*((rounds+1)/2)), txClients*(3*(rounds/2)+rounds)
	if len(rows) != wantRows || len(gone) != wantGone || len(next) != txClients*6*rounds {
		t.Fatalf("node read back %d rows, %d rolled back, %d leaf_next IDs; want %d, %d, %d",
			len(rows), len(gone), len(next), wantRows, wantGone, txClients*6*rounds)
	}
	ids.check(t)
	checkStored(t, tp.dsn, "node_rows", wantRows, rows, gone)
}

// txGormRow is a GORM model whose primary key the proxy fills: GORM leaves the zero ID
// out of the INSERT and reads the filled one back through RETURNING.
type txGormRow struct {
	ID      int64 `gorm:"primaryKey"`
	Client  string
	Version int
}

func (txGormRow) TableName() string { return "gorm_rows" }

// TestTxPoolGORM runs GORM with 50 goroutines over a pool of 5, each on a session of its
// own (database/sql opens 50): Create, First, Transaction (committed and rolled back,
// with a nested one rolled back to its savepoint), Save, batch Create and leaf_next
// through Raw, with GORM's defaults (pgx caching prepared statements), with GORM's own
// PrepareStmt, and with PreferSimpleProtocol.
func TestTxPoolGORM(t *testing.T) {
	tp := startTxPool(t, "txgorm", 22, []string{"gorm_rows.id=" + snowOrder},
		`CREATE TABLE gorm_rows (id bigint PRIMARY KEY, client text NOT NULL, version int NOT NULL)`)
	ids := newIDSet()
	var mu sync.Mutex
	var rows, gone []int64
	const rounds = 3
	w := watchServers(t, tp)
	for _, v := range []struct {
		name string
		open func() gorm.Dialector
		cfg  gorm.Config
	}{
		{"default", func() gorm.Dialector { return gormpg.Open(tp.url) }, gorm.Config{}},
		{"PrepareStmt", func() gorm.Dialector { return gormpg.Open(tp.url) }, gorm.Config{PrepareStmt: true}},
		{"PreferSimpleProtocol", func() gorm.Dialector {
			return gormpg.New(gormpg.Config{DSN: tp.url, PreferSimpleProtocol: true})
		}, gorm.Config{}},
	} {
		t.Run(v.name, func(t *testing.T) {
			cfg := v.cfg
			cfg.Logger = logger.Default.LogMode(logger.Silent)
			db, err := gorm.Open(v.open(), &cfg)
			if err != nil {
				t.Fatal(err)
			}
			sqlDB, err := db.DB()
			if err != nil {
				t.Fatal(err)
			}
			defer sqlDB.Close()
			openSessions(t, sqlDB)
			errs := make(chan error, txClients)
			var wg sync.WaitGroup
			for i := range txClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					kept, rolledBack, err := gormClient(db, ids, fmt.Sprintf("gorm %s %d", v.name, i), rounds)
					mu.Lock()
					rows, gone = append(rows, kept...), append(gone, rolledBack...)
					mu.Unlock()
					ids.add("gorm "+v.name, kept...)
					ids.add("gorm "+v.name+" rolled back", rolledBack...)
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	w.Stop(t, "GORM")
	ids.check(t)
	// Per round: 1 Create, 2 in the committed transaction, 3 in the batch.
	checkStored(t, tp.dsn, "gorm_rows", 3*txClients*rounds*6, rows, gone)
}

// openSessions makes database/sql open txClients sessions and keep them, so that the load
// runs on more client sessions than the pool has server connections.
func openSessions(t *testing.T, db *sql.DB) {
	t.Helper()
	db.SetMaxOpenConns(txClients)
	db.SetMaxIdleConns(txClients)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var conns []*sql.Conn
	for range txClients {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	if n := db.Stats().OpenConnections; n != txClients {
		t.Fatalf("database/sql keeps %d sessions open, want %d", n, txClients)
	}
}

// errRollBack makes a GORM transaction roll back.
var errRollBack = errors.New("roll back")

// gormClient is one goroutine of TestTxPoolGORM. It returns the IDs of the rows it
// committed and of those it rolled back, and adds its leaf_next IDs to ids.
func gormClient(db *gorm.DB, ids *idSet, client string, rounds int) (kept, rolledBack []int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db = db.WithContext(ctx)
	for r := range rounds {
		one := txGormRow{Client: client}
		if err := db.Create(&one).Error; err != nil {
			return kept, rolledBack, fmt.Errorf("%s: Create: %w", client, err)
		}
		if one.ID == 0 {
			return kept, rolledBack, fmt.Errorf("%s: Create left the ID zero", client)
		}
		kept = append(kept, one.ID)
		var back txGormRow
		if err := db.First(&back, one.ID).Error; err != nil || back.Client != client {
			return kept, rolledBack, fmt.Errorf("%s: First(%d) = %+v, %v", client, one.ID, back, err)
		}
		one.Version = r + 1
		if err := db.Save(&one).Error; err != nil {
			return kept, rolledBack, fmt.Errorf("%s: Save: %w", client, err)
		}
		// A committed transaction: two Creates, a Save, a First that sees the Save, and a
		// nested transaction (a savepoint) rolled back.
		var pair [2]txGormRow
		var inner txGormRow
		err := db.Transaction(func(tx *gorm.DB) error {
			for i := range pair {
				pair[i] = txGormRow{Client: client}
				if err := tx.Create(&pair[i]).Error; err != nil {
					return err
				}
			}
			pair[0].Version = 10 + r
			if err := tx.Save(&pair[0]).Error; err != nil {
				return err
			}
			var seen txGormRow
			if err := tx.First(&seen, pair[0].ID).Error; err != nil {
				return err
			}
			if seen.Version != 10+r {
				return fmt.Errorf("version %d inside the transaction, want %d", seen.Version, 10+r)
			}
			err := tx.Transaction(func(tx *gorm.DB) error {
				inner = txGormRow{Client: client}
				if err := tx.Create(&inner).Error; err != nil {
					return err
				}
				return errRollBack
			})
			if !errors.Is(err, errRollBack) {
				return fmt.Errorf("nested transaction: %v", err)
			}
			return nil
		})
		if err != nil {
			return kept, rolledBack, fmt.Errorf("%s: Transaction: %w", client, err)
		}
		kept = append(kept, pair[0].ID, pair[1].ID)
		rolledBack = append(rolledBack, inner.ID)
		// A rolled-back transaction: its row must not be stored.
		var lost txGormRow
		err = db.Transaction(func(tx *gorm.DB) error {
			lost = txGormRow{Client: client}
			if err := tx.Create(&lost).Error; err != nil {
				return err
			}
			return errRollBack
		})
		if !errors.Is(err, errRollBack) {
			return kept, rolledBack, fmt.Errorf("%s: rolled-back Transaction: %v", client, err)
		}
		rolledBack = append(rolledBack, lost.ID)
		batch := []txGormRow{{Client: client}, {Client: client}, {Client: client}}
		if err := db.Create(&batch).Error; err != nil {
			return kept, rolledBack, fmt.Errorf("%s: batch Create: %w", client, err)
		}
		for _, b := range batch {
			if b.ID == 0 {
				return kept, rolledBack, fmt.Errorf("%s: batch Create left an ID zero", client)
			}
			kept = append(kept, b.ID)
		}
		// leaf_next through Raw: a parameter, or inlined with PreferSimpleProtocol.
		var next int64
		if err := db.Raw("SELECT leaf_next(?)", snowOrder).Scan(&next).Error; err != nil || next <= 0 {
			return kept, rolledBack, fmt.Errorf("%s: leaf_next: %d, %v", client, next, err)
		}
		ids.add("gorm leaf_next", next)
		var versions []int
		if err := db.Model(&txGormRow{}).Where("id IN ?", []int64{one.ID, pair[0].ID}).Order("version").Pluck("version", &versions).Error; err != nil {
			return kept, rolledBack, fmt.Errorf("%s: Pluck: %w", client, err)
		}
		if len(versions) != 2 || versions[0] != r+1 || versions[1] != 10+r {
			return kept, rolledBack, fmt.Errorf("%s: stored versions %v, want [%d %d]", client, versions, r+1, 10+r)
		}
	}
	return kept, rolledBack, nil
}

// TestTxPoolPgx runs pgxpool with 50 sessions, statement cache on (pgx's default), over a
// pool of 5: filled INSERTs and leaf_next in every query mode of pgx, pipelined batches,
// transactions (committed and rolled back) and CopyFrom into a table whose key the proxy
// fills, inside and outside transactions. The proxy-level tests run pgx over a pool, but
// not pgxpool with filled INSERTs, nor CopyFrom from many sessions at once.
func TestTxPoolPgx(t *testing.T) {
	tp := startTxPool(t, "txpgx", 23, []string{"pgx_rows.id=" + snowOrder, "copy_rows.id=" + txSegTag},
		`CREATE TABLE pgx_rows (id bigint PRIMARY KEY, client int NOT NULL, note text NOT NULL)`,
		`CREATE TABLE copy_rows (id bigint PRIMARY KEY, client int NOT NULL, note text NOT NULL)`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(tp.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = txClients
	pp, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pp.Close()
	// Open every session before the load.
	var held []*pgxpool.Conn
	for range txClients {
		c, err := pp.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	if n := pp.Stat().TotalConns(); n != txClients {
		t.Fatalf("pgxpool holds %d sessions, want %d", n, txClients)
	}

	const rounds = 3
	ids := newIDSet()
	var mu sync.Mutex
	var rows, gone []int64
	w := watchServers(t, tp)
	errs := make(chan error, txClients)
	var wg sync.WaitGroup
	for i := range txClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := pgxClient(ctx, pp, i, rounds)
			mu.Lock()
			rows, gone = append(rows, r.rows...), append(gone, r.gone...)
			mu.Unlock()
			ids.add("pgx row", r.rows...)
			ids.add("pgx rolled back", r.gone...)
			ids.add("pgx leaf_next", r.next...)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	w.Stop(t, "pgxpool")
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := pp.Stat().TotalConns(); n != txClients {
		t.Errorf("pgxpool ended with %d sessions, want %d: some were broken", n, txClients)
	}
	ids.check(t)
	checkStored(t, tp.dsn, "pgx_rows", txClients*rounds*9, rows, gone)
	checkStored(t, tp.dsn, "copy_rows", txClients*rounds*20, nil, nil)
}

// pgxIDs is what one client of TestTxPoolPgx read back.
type pgxIDs struct{ rows, gone, next []int64 }

// pgxClient is one goroutine of TestTxPoolPgx. Per round it stores 9 rows in pgx_rows
// (one per query mode, three in a batch, one in a transaction), rolls one back, copies 20
// rows into copy_rows and takes 10 IDs with leaf_next.
func pgxClient(ctx context.Context, pp *pgxpool.Pool, client, rounds int) (got pgxIDs, err error) {
	const insert = "INSERT INTO pgx_rows (client, note) VALUES ($1, $2) RETURNING id"
	fail := func(what string, err error) error { return fmt.Errorf("client %d: %s: %w", client, what, err) }
	for r := range rounds {
		for _, mode := range []pgx.QueryExecMode{
			pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
			pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
		} {
			var id, next int64
			if err := pp.QueryRow(ctx, insert, mode, client, mode.String()).Scan(&id); err != nil {
				return got, fail("INSERT in mode "+mode.String(), err)
			}
			got.rows = append(got.rows, id)
			if err := pp.QueryRow(ctx, "SELECT leaf_next($1)", mode, snowOrder).Scan(&next); err != nil {
				return got, fail("leaf_next in mode "+mode.String(), err)
			}
			got.next = append(got.next, next)
		}

		// A pipelined batch: one round trip, one implicit transaction.
		batch := &pgx.Batch{}
		for range 3 {
			batch.Queue(insert, client, "batch")
		}
		batch.Queue("SELECT leaf_next($1)", snowOrder)
		batch.Queue("SELECT leaf_next($1, $2)", snowOrder, 3)
		br := pp.SendBatch(ctx, batch)
		for i := range 4 {
			var id int64
			if err := br.QueryRow().Scan(&id); err != nil {
				br.Close()
				return got, fail("batch", err)
			}
			if i < 3 {
				got.rows = append(got.rows, id)
			} else {
				got.next = append(got.next, id)
			}
		}
		many, err := br.Query()
		if err == nil {
			var ns []int64
			ns, err = pgx.CollectRows(many, pgx.RowTo[int64])
			if err == nil && len(ns) != 3 {
				err = fmt.Errorf("leaf_next($1, 3) gave %d rows", len(ns))
			}
			got.next = append(got.next, ns...)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return got, fail("batch", err)
		}

		// A transaction with a filled INSERT and a COPY, committed.
		copyRows := func(note string) pgx.CopyFromSource {
			var src [][]any
			for range 10 {
				src = append(src, []any{client, note})
			}
			return pgx.CopyFromRows(src)
		}
		err = pgx.BeginFunc(ctx, pp, func(tx pgx.Tx) error {
			var id int64
			if err := tx.QueryRow(ctx, insert, client, "tx").Scan(&id); err != nil {
				return err
			}
			got.rows = append(got.rows, id)
			n, err := tx.CopyFrom(ctx, pgx.Identifier{"copy_rows"}, []string{"client", "note"}, copyRows("tx copy"))
			if err != nil || n != 10 {
				return fmt.Errorf("CopyFrom: %d rows, %v", n, err)
			}
			var seen int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM copy_rows WHERE client = $1", client).Scan(&seen); err != nil {
				return err
			}
			if seen != r*20+10 {
				return fmt.Errorf("sees %d of its copied rows in its transaction, want %d", seen, r*20+10)
			}
			return nil
		})
		if err != nil {
			return got, fail("transaction", err)
		}
		// A transaction rolled back: its row must not be stored.
		tx, err := pp.Begin(ctx)
		if err != nil {
			return got, fail("begin", err)
		}
		var lost int64
		err = tx.QueryRow(ctx, insert, client, "rolled back").Scan(&lost)
		if rerr := tx.Rollback(ctx); err == nil {
			err = rerr
		}
		if err != nil {
			return got, fail("rolled-back transaction", err)
		}
		got.gone = append(got.gone, lost)
		// COPY outside a transaction.
		n, err := pp.CopyFrom(ctx, pgx.Identifier{"copy_rows"}, []string{"client", "note"}, copyRows("copy"))
		if err == nil && n != 10 {
			err = fmt.Errorf("%d rows copied, want 10", n)
		}
		if err != nil {
			return got, fail("CopyFrom", err)
		}
	}
	return got, nil
}

// TestTxPoolLibPQAndPsql runs lib/pq with 50 sessions and psql over a pool of 5. Two
// lib/pq sessions and a psql session SET search_path to schemas of their own (and one
// SET ROLE), under a load of filled INSERTs and leaf_next (prepared, parameterised and
// simple) from 20 other sessions checking that they keep the default search_path and
// user: each setting follows its client from server connection to server connection
// and reaches nobody else.
// LISTEN and pg_advisory_lock (and, from psql, a temporary table and SQL-level PREPARE)
// are refused with 0A000 and the session goes on. psql also
// inserts (simple protocol, in and out of a transaction) and COPYs into a filled table.
func TestTxPoolLibPQAndPsql(t *testing.T) {
	psql := lookTool(t, "psql")
	tp := startTxPool(t, "txpq", 24, []string{"pq_rows.id=" + snowOrder},
		`CREATE TABLE pq_rows (id bigint PRIMARY KEY, client text NOT NULL, note text NOT NULL)`,
		`CREATE SCHEMA sa; CREATE TABLE sa.t AS SELECT 'a'::text AS v;
		 CREATE SCHEMA sb; CREATE TABLE sb.t AS SELECT 'b'::text AS v;
		 GRANT USAGE ON SCHEMA sa, sb TO `+testenv.SCRAMUser+`;
		 GRANT SELECT ON sa.t, sb.t TO `+testenv.SCRAMUser)
	// A role of this database's own that the pooled user may SET ROLE to.
	role := queryText(t, tp.dsn, "SELECT current_database() || '_role'")
	execSQL(t, tp.dsn, "CREATE ROLE "+role+" NOLOGIN; GRANT "+role+" TO "+testenv.SCRAMUser+
		"; GRANT USAGE ON SCHEMA sb TO "+role+"; GRANT SELECT ON sb.t TO "+role)
	t.Cleanup(func() { execSQL(t, tp.dsn, "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	db, err := sql.Open("postgres", tp.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	openSessions(t, db)
	var defaultPath string
	if err := db.QueryRowContext(ctx, "SHOW search_path").Scan(&defaultPath); err != nil {
		t.Fatal(err)
	}

	ids := newIDSet()
	var mu sync.Mutex
	var rows []int64
	w := watchServers(t, tp)

	// The load: 20 sessions of the database/sql pool.
	insert, err := db.PrepareContext(ctx, "INSERT INTO pq_rows (client, note) VALUES ($1, $2) RETURNING id")
	if err != nil {
		t.Fatal(err)
	}
	defer insert.Close()
	stop := make(chan struct{})
	loadErrs := make(chan error, 20)
	var load sync.WaitGroup
	for i := range 20 {
		load.Add(1)
		go func() {
			defer load.Done()
			loadErrs <- pqLoad(ctx, db, insert, i, defaultPath, stop, ids, func(id int64) {
				mu.Lock()
				rows = append(rows, id)
				mu.Unlock()
			})
		}()
	}

	// psql, meanwhile, with a search_path of its own.
	script := filepath.Join(t.TempDir(), "search_path.sql")
	if err := os.WriteFile(script, []byte(`SHOW search_path;
SET search_path TO sb, public;
SELECT 'v=' || v FROM t;
LISTEN channel;
SELECT 'after listen=' || v FROM t;
SELECT pg_advisory_lock(7);
CREATE TEMP TABLE scratch (x int);
PREPARE p AS SELECT 1;
INSERT INTO pq_rows (client, note) VALUES ('psql', 'simple') RETURNING 'id=' || id;
SELECT leaf_next('`+snowOrder+`');
BEGIN;
INSERT INTO pq_rows (client, note) VALUES ('psql', 'tx') RETURNING 'id=' || id;
SELECT 'tx=' || v FROM t;
COMMIT;
COPY pq_rows (client, note) FROM STDIN;
psql	copy 1
psql	copy 2
psql	copy 3
\.
SELECT 'copied=' || count(DISTINCT id) FROM pq_rows WHERE note LIKE 'copy %';
SHOW search_path;
`), 0o644); err != nil {
		t.Fatal(err)
	}
	psqlOut := make(chan [2]string, 1)
	go func() {
		stdout, stderr := runPsql(psql, tp.url, script)
		psqlOut <- [2]string{stdout, stderr}
	}()

	// Three pinned lib/pq sessions: two with a search_path of their own, one without.
	pinned := func() *sql.Conn {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ca, cb, plain := pinned(), pinned(), pinned()
	for c, schema := range map[*sql.Conn]string{ca: "sa", cb: "sb"} {
		if _, err := c.ExecContext(ctx, "SET search_path TO "+schema+", public"); err != nil {
			t.Fatal(err)
		}
	}
	// SET ROLE too, which pg_settings does not list.
	if _, err := cb.ExecContext(ctx, "SET ROLE "+role); err != nil {
		t.Fatal(err)
	}
	users := map[*sql.Conn]string{ca: testenv.SCRAMUser, cb: role}
	pids := map[string]map[int]bool{"a": {}, "b": {}}
	var psqlRes *[2]string
	for round := 0; round < 30 || psqlRes == nil; round++ {
		select {
		case res := <-psqlOut:
			psqlRes = &res
		default:
		}
		for c, v := range map[*sql.Conn]string{ca: "a", cb: "b"} {
			var path, got, user string
			var pid int
			err := c.QueryRowContext(ctx, "SELECT current_setting('search_path'), (SELECT v FROM t), current_user, pg_backend_pid()").Scan(&path, &got, &user, &pid)
			if err != nil {
				t.Fatalf("round %d, client %s: %v", round, v, err)
			}
			if path != "s"+v+", public" || got != v || user != users[c] {
				t.Fatalf("round %d: client %s has search_path %q, sees table t of %q and is %s (want %s)", round, v, path, got, user, users[c])
			}
			pids[v][pid] = true
		}
		// In a transaction too, with a parameter (the extended protocol).
		tx, err := ca.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		if err := tx.QueryRowContext(ctx, "SELECT v || $1 FROM t", "!").Scan(&got); err != nil || got != "a!" {
			t.Fatalf("round %d: client a in a transaction sees %q (%v)", round, got, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		var path, user string
		if err := plain.QueryRowContext(ctx, "SELECT current_setting('search_path'), current_user").Scan(&path, &user); err != nil {
			t.Fatal(err)
		}
		if path != defaultPath || user != testenv.SCRAMUser {
			t.Fatalf("round %d: a client that set nothing has search_path %q and current_user %s, want %q and %s", round, path, user, defaultPath, testenv.SCRAMUser)
		}
		_, err = plain.ExecContext(ctx, "SELECT v FROM t")
		if sqlState(err) != "42P01" {
			t.Fatalf("round %d: a client that set nothing finds a table t on its search_path: %v", round, err)
		}
	}
	close(stop)
	load.Wait()
	close(loadErrs)
	for err := range loadErrs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// Refused features: 0A000, and the same session goes on.
	for _, q := range []struct {
		sql  string
		args []any
	}{{"LISTEN channel", nil}, {"SELECT pg_advisory_lock(1)", nil}, {"SELECT pg_advisory_lock($1)", []any{2}}} {
		_, err := plain.ExecContext(ctx, q.sql, q.args...)
		if sqlState(err) != "0A000" {
			t.Fatalf("lib/pq %s: %v, want SQLSTATE 0A000", q.sql, err)
		}
		var id int64
		if err := plain.QueryRowContext(ctx, "INSERT INTO pq_rows (client, note) VALUES ('lib/pq', $1) RETURNING id", "after "+q.sql).Scan(&id); err != nil {
			t.Fatalf("lib/pq after the refused %s: %v", q.sql, err)
		}
		ids.add("lib/pq after a refusal", id)
		rows = append(rows, id)
	}
	w.Stop(t, "lib/pq and psql")

	// Both SET clients moved between server connections, and kept their setting.
	t.Logf("FIGURE lib/pq: the client with search_path sa ran on %d server connections, the one with sb on %d", len(pids["a"]), len(pids["b"]))
	if len(pids["a"])+len(pids["b"]) < 3 {
		t.Errorf("the two clients with a search_path ran on %d and %d server connections: the test did not move them", len(pids["a"]), len(pids["b"]))
	}

	stdout, stderr := psqlRes[0], psqlRes[1]
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	wantShape := []string{defaultPath, "v=b", "after listen=b", "id=", "", "id=", "tx=b", "copied=3", "sb, public"}
	if len(lines) != len(wantShape) {
		t.Fatalf("psql printed %d lines, want %d:\n%s\nstderr:\n%s", len(lines), len(wantShape), stdout, stderr)
	}
	for i, want := range wantShape {
		switch want {
		case "id=", "":
			id, err := strconv.ParseInt(strings.TrimPrefix(lines[i], want), 10, 64)
			if err != nil || !strings.HasPrefix(lines[i], want) {
				t.Fatalf("psql line %d: %q, want an ID\n%s", i+1, lines[i], stdout)
			}
			if want == "id=" {
				rows = append(rows, id)
			}
			ids.add("psql", id)
		default:
			if lines[i] != want {
				t.Fatalf("psql line %d: %q, want %q\n%s\nstderr:\n%s", i+1, lines[i], want, stdout, stderr)
			}
		}
	}
	if n := strings.Count(stderr, "ERROR:  0A000"); n != 4 || strings.Count(stderr, "ERROR:") != 4 {
		t.Fatalf("psql: %d errors with SQLSTATE 0A000, want 4 (LISTEN, pg_advisory_lock, CREATE TEMP TABLE, PREPARE) and no other:\n%s", n, stderr)
	}
	ids.check(t)
	checkStored(t, tp.dsn, "pq_rows", len(rows)+3, rows, nil) // and psql's COPY
}

// pqLoad is one session of the load of TestTxPoolLibPQAndPsql, until stop: a prepared
// filled INSERT, leaf_next as a simple query and with a parameter, and a check that the
// session has the default search_path.
func pqLoad(ctx context.Context, db *sql.DB, insert *sql.Stmt, client int, defaultPath string, stop <-chan struct{}, ids *idSet, stored func(int64)) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		var id, next, param int64
		if err := insert.QueryRowContext(ctx, fmt.Sprint(client), "load").Scan(&id); err != nil {
			return fmt.Errorf("load %d: INSERT: %w", client, err)
		}
		stored(id)
		if err := db.QueryRowContext(ctx, "SELECT leaf_next('"+snowOrder+"')").Scan(&next); err != nil {
			return fmt.Errorf("load %d: leaf_next: %w", client, err)
		}
		if err := db.QueryRowContext(ctx, "SELECT leaf_next($1)", snowOrder).Scan(&param); err != nil {
			return fmt.Errorf("load %d: leaf_next($1): %w", client, err)
		}
		ids.add("lib/pq", id)
		ids.add("lib/pq leaf_next", next, param)
		var path, user string
		if err := db.QueryRowContext(ctx, "SELECT current_setting('search_path'), current_user").Scan(&path, &user); err != nil {
			return fmt.Errorf("load %d: %w", client, err)
		}
		if path != defaultPath || user != testenv.SCRAMUser {
			return fmt.Errorf("load %d: search_path %q and current_user %s, want the default %q and %s: another client's SET reached it",
				client, path, user, defaultPath, testenv.SCRAMUser)
		}
	}
}

// runPsql runs a script file with psql and returns its stdout and stderr; errors of the
// statements (with their SQLSTATE) are on stderr and do not stop the script.
func runPsql(psql, url, file string) (stdout, stderr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out, errOut strings.Builder
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-At", "-v", "VERBOSITY=verbose", "-d", url, "-f", file)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(&errOut, "\npsql: %v", err)
	}
	return out.String(), errOut.String()
}
