package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafproxy/leafproxy/internal/testenv"
)

// prometheus is a Prometheus server the test started, scraping one target and evaluating
// the shipped alert rules.
type prometheus struct {
	t    testing.TB
	url  string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// promAlert is one alert of /api/v1/alerts.
type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"` // pending or firing
	ActiveAt time.Time         `json:"activeAt"`
}

// requireTool returns the path of a command, skipping the test without it, or failing it
// under CI, where a missing tool is a broken setup.
func requireTool(t testing.TB, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: install Debian's %s package (scripts/install-deps.sh does)", name, pkg)
	}
	t.Skipf("%s not found: install Debian's %s package (scripts/install-deps.sh does)", name, pkg)
	return ""
}

// startPrometheus runs a Prometheus server on a free loopback port, with its own
// configuration and data directory, scraping target every 2 s and evaluating the
// repository's alert rules every second.
func startPrometheus(t testing.TB, target string) *prometheus {
	t.Helper()
	bin := requireTool(t, "prometheus", "prometheus")
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(root, "deploy", "prometheus", "leafproxy-alerts.yml")
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// A failed scrape marks the target's series stale, which would restart an alert's
	// `for`: give a scrape on a loaded machine its whole interval.
	config := fmt.Sprintf(`global:
  scrape_interval: 2s
  scrape_timeout: 2s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: leafproxy
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &prometheus{t: t, url: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan struct{}),
		log: filepath.Join(dir, "prometheus.log")}
	logFile, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port), "--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	go func() { _ = p.cmd.Wait(); logFile.Close(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("prometheus log:\n%s", b)
		}
	})
	p.waitFor("Prometheus to be ready", time.Minute, func() (bool, string) {
		resp, err := http.Get(p.url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// waitFor polls cond until it holds, failing the test after timeout or when Prometheus
// exits; cond's second result says what it saw, for the failure message.
func (p *prometheus) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			p.t.Fatalf("prometheus exited while waiting for %s:\n%s", what, b)
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, saw)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// getJSON fetches a Prometheus API path and decodes its data field into out.
func (p *prometheus) getJSON(path string, out any) error {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(p.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s %s", path, body.Status, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// alerts returns the pending and firing alerts.
func (p *prometheus) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.getJSON("/api/v1/alerts", &data)
	return data.Alerts, err
}

// query returns the value of an instant query with one result, or "" for none.
func (p *prometheus) query(expr string) (string, error) {
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := p.getJSON("/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return "", err
	}
	if len(data.Result) == 0 {
		return "", nil
	}
	s, _ := data.Result[0].Value[1].(string)
	return s, nil
}

// stateOf returns the state of the named alert ("" when it is neither pending nor firing).
func stateOf(alerts []promAlert, name string) string {
	for _, a := range alerts {
		if a.Labels["alertname"] == name {
			return a.State
		}
	}
	return ""
}

func describeAlerts(alerts []promAlert) string {
	var parts []string
	for _, a := range alerts {
		parts = append(parts, a.Labels["alertname"]+"="+a.State)
	}
	if len(parts) == 0 {
		return "no alerts"
	}
	return strings.Join(parts, ", ")
}

// TestAlertWorkerIDNotHeld runs a real Prometheus server against a running proxy with the
// repository's alert rules. While the proxy holds its worker lease nothing fires; once
// the store behind the lease is stopped, the proxy cannot renew, stops issuing snowflake
// IDs, and LeafproxyWorkerIDNotHeld and LeafproxyStoreUnreachable fire.
func TestAlertWorkerIDNotHeld(t *testing.T) {
	requireServeFlags(t, "worker-source", "snowflake-tags")
	requireTool(t, "prometheus", "prometheus")
	pg := testenv.NewPostgres(t)
	// The server's own database: the server is the test's, and a database made with
	// NewDatabase could not be dropped at the end, with the server stopped.
	dsn := pg.URL("postgres")
	migrateUp(t, dsn)
	addTag(t, dsn, segA, 100)
	cfg := ProxyConfig{Upstream: hostPort(t, dsn), Store: dsn, WorkerSource: "postgres", SnowflakeTags: []string{snowOrder}}
	if hasFlag(t, "serve", "worker-lease-ttl") {
		// A short lease: the proxy fences itself seconds after the store goes away.
		cfg.Extra = append(cfg.Extra, "--worker-lease-ttl", "6s")
	}
	proxy := StartProxy(t, "alerting", cfg)
	requireHTTPIDs(t, proxy, segA, snowOrder)

	prom := startPrometheus(t, fmt.Sprintf("127.0.0.1:%d", proxy.HTTPPort))
	prom.waitFor("the proxy to be scraped with its worker ID held and the store up", 2*time.Minute, func() (bool, string) {
		held, err := prom.query(`leafproxy_worker_id_held{job="leafproxy"}`)
		if err != nil {
			return false, err.Error()
		}
		up, err := prom.query(`leafproxy_store_up{job="leafproxy"}`)
		if err != nil {
			return false, err.Error()
		}
		return held == "1" && up == "1", fmt.Sprintf("worker_id_held=%q store_up=%q", held, up)
	})
	// The rules ran against a healthy proxy: the alerts of this test are silent. Several
	// evaluations must pass, so wait for a rule evaluation after the first healthy scrape.
	healthyFrom := time.Now()
	prom.waitFor("ten seconds of rule evaluations on a healthy proxy", time.Minute, func() (bool, string) {
		alerts, err := prom.alerts()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range []string{"LeafproxyWorkerIDNotHeld", "LeafproxyStoreUnreachable"} {
			if st := stateOf(alerts, name); st != "" {
				t.Fatalf("%s is %s while the proxy holds its lease and reaches the store", name, st)
			}
		}
		return time.Since(healthyFrom) > 10*time.Second, describeAlerts(alerts)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stoppedAt := time.Now()
	if err := pg.Stop(ctx); err != nil {
		t.Fatalf("stop PostgreSQL: %v", err)
	}
	// The proxy fences itself a tenth of the lease before it expires (27 s for the default
	// 30 s lease); the alert holds for a minute before it fires.
	var heldLostAt time.Time
	prom.waitFor("LeafproxyWorkerIDNotHeld and LeafproxyStoreUnreachable to fire", 5*time.Minute, func() (bool, string) {
		if heldLostAt.IsZero() {
			if held, _ := prom.query(`leafproxy_worker_id_held{job="leafproxy"}`); held == "0" {
				heldLostAt = time.Now()
			}
		}
		alerts, err := prom.alerts()
		if err != nil {
			return false, err.Error()
		}
		return stateOf(alerts, "LeafproxyWorkerIDNotHeld") == "firing" && stateOf(alerts, "LeafproxyStoreUnreachable") == "firing",
			describeAlerts(alerts)
	})
	firedAfter := time.Since(stoppedAt)
	if heldLostAt.IsZero() {
		t.Fatal("the alert fired, but Prometheus never showed leafproxy_worker_id_held at 0")
	}
	// What the alert says is what a client sees: no snowflake ID without the lease.
	if code, body, err := proxy.HTTPGet("/api/snowflake/get/"+snowOrder, nil); err != nil || code == http.StatusOK {
		t.Errorf("snowflake ID with the worker ID not held: HTTP %d %q, %v; want a refusal", code, body, err)
	}
	t.Logf("FIGURE alerts: worker ID seen not held %v after the store stopped; LeafproxyWorkerIDNotHeld and LeafproxyStoreUnreachable firing after %v",
		heldLostAt.Sub(stoppedAt).Round(time.Second), firedAfter.Round(time.Second))
}
