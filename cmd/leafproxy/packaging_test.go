package main

import (
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/leafproxy/leafproxy/internal/config"
)

// repoFile reads a file at the repository root.
func repoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestExampleConfig: the example file names every setting, and serve accepts it.
func TestExampleConfig(t *testing.T) {
	text := repoFile(t, "leafproxy.example.yaml")
	var keys map[string]yaml.Node
	if err := yaml.Unmarshal([]byte(text), &keys); err != nil {
		t.Fatal(err)
	}
	for _, name := range config.Names() {
		if _, ok := keys[name]; !ok {
			t.Errorf("leafproxy.example.yaml lacks %s", name)
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := config.RegisterFlags(fs)
	if err := fs.Parse([]string{"--config", filepath.Join("..", "..", "leafproxy.example.yaml")}); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(f, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("the example configuration does not load: %v", err)
	}
	// Its values are the defaults, except where it shows an example.
	d := config.Defaults()
	if c.Listen != d.Listen || c.HTTP != d.HTTP || c.SegmentPreload != d.SegmentPreload || c.WorkerSource != config.WorkerPostgres {
		t.Errorf("example values drift from the defaults: %+v", c)
	}
}

// TestDockerfile: the image builds the package `make build` builds, with cgo, on the Go
// release go.mod names, and runs as a non-root user.
func TestDockerfile(t *testing.T) {
	df := repoFile(t, "Dockerfile")
	mk := repoFile(t, "Makefile")
	mod := repoFile(t, "go.mod")

	makeBuild := regexp.MustCompile(`(?m)^\t\$\(GO\) build (.*)$`).FindStringSubmatch(mk)
	if makeBuild == nil {
		t.Fatal("Makefile has no `$(GO) build` line")
	}
	makePkg := lastField(makeBuild[1])
	dockerBuild := regexp.MustCompile(`(?m)CGO_ENABLED=1 go build (.*?)(\\|&&|$)`).FindStringSubmatch(df)
	if dockerBuild == nil {
		t.Fatal("Dockerfile has no `CGO_ENABLED=1 go build` (pg_query_go needs cgo)")
	}
	if got := lastField(dockerBuild[1]); got != makePkg {
		t.Errorf("Dockerfile builds %s, make build builds %s", got, makePkg)
	}
	// The builder is pinned to a Go release that satisfies go.mod's go line, so that the
	// build neither fails nor downloads a toolchain.
	goVersion := regexp.MustCompile(`(?m)^go (\S+)`).FindStringSubmatch(mod)
	builder := regexp.MustCompile(`(?m)^FROM golang:(\d+\.\d+\.\d+)-bookworm AS build$`).FindStringSubmatch(df)
	if goVersion == nil || builder == nil {
		t.Fatalf("go.mod's go line %v or the pinned builder image golang:X.Y.Z-bookworm %v not found", goVersion, builder)
	}
	if versionLess(builder[1], goVersion[1]) {
		t.Errorf("builder image golang:%s is older than go.mod's go %s", builder[1], goVersion[1])
	}
	if !strings.Contains(df, "GOTOOLCHAIN=local") {
		t.Error("the build may download a toolchain: set GOTOOLCHAIN=local")
	}
	if !strings.Contains(df, "FROM debian:bookworm-slim") {
		t.Error("runtime image is not debian:bookworm-slim (the builder's glibc)")
	}
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(df)
	if user == nil || strings.HasPrefix(user[1], "0") || strings.HasPrefix(user[1], "root") {
		t.Errorf("image runs as %v, want a non-root user", user)
	}
	for _, want := range []string{`HEALTHCHECK`, `"leafproxy", "healthcheck"`, `ENTRYPOINT ["leafproxy"]`} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile lacks %s", want)
		}
	}
	// Whatever the Dockerfile COPYs from the context must not be ignored away.
	if di, err := os.ReadFile(filepath.Join("..", "..", ".dockerignore")); err == nil {
		for _, line := range strings.Split(string(di), "\n") {
			if l := strings.TrimSpace(line); l == "go.mod" || l == "go.sum" || l == "cmd" {
				t.Errorf(".dockerignore drops %s, which the build needs", l)
			}
		}
	}
}

// versionLess compares dotted release numbers ("1.26.8" < "1.26.10").
func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func lastField(s string) string {
	f := strings.Fields(s)
	return f[len(f)-1]
}

type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		PullPolicy  string            `yaml:"pull_policy"`
		Volumes     []string          `yaml:"volumes"`
		Build       any               `yaml:"build"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Ports []string `yaml:"ports"`
	} `yaml:"services"`
}

// TestCompose: postgres, zookeeper, a one-shot migrate, the demo of `make run` from the
// same SQL file, and leafproxy, with health checks and a start order that waits for them;
// one image built once; every URL quoted; every LEAFPROXY_ variable a real setting.
func TestCompose(t *testing.T) {
	var c composeFile
	text := repoFile(t, "docker-compose.yml")
	dec := yaml.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"postgres", "zookeeper", "migrate", "demo", "leafproxy"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no %s service", name)
		}
	}
	for _, name := range []string{"postgres", "zookeeper", "leafproxy"} {
		if hc := c.Services[name].Healthcheck; hc == nil || len(hc.Test) == 0 {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	mig, lp := c.Services["migrate"], c.Services["leafproxy"]
	if len(mig.Command) < 2 || mig.Command[0] != "migrate" || mig.Command[1] != "up" {
		t.Errorf("migrate runs %v, want migrate up", mig.Command)
	}
	if mig.DependsOn["postgres"].Condition != "service_healthy" {
		t.Errorf("migrate does not wait for a healthy postgres: %+v", mig.DependsOn)
	}
	for dep, cond := range map[string]string{"postgres": "service_healthy", "zookeeper": "service_healthy", "migrate": "service_completed_successfully"} {
		if lp.DependsOn[dep].Condition != cond {
			t.Errorf("leafproxy depends on %s with %q, want %q", dep, lp.DependsOn[dep].Condition, cond)
		}
	}
	if mig.Image != lp.Image || mig.Build == nil || lp.Build != nil || lp.PullPolicy != "never" {
		t.Errorf("migrate should build the image once and leafproxy run it without pulling: %q %v, %q %v %q",
			mig.Image, mig.Build, lp.Image, lp.Build, lp.PullPolicy)
	}
	// The demo is the file `make run` runs, after the migration and before the proxy.
	demo := c.Services["demo"]
	runSh := repoFile(t, "scripts/run.sh")
	if !strings.Contains(runSh, "-f scripts/demo.sql") {
		t.Error("scripts/run.sh does not run scripts/demo.sql")
	}
	if len(demo.Volumes) != 1 || !strings.HasPrefix(demo.Volumes[0], "./scripts/demo.sql:/demo.sql") {
		t.Errorf("demo mounts %v, want ./scripts/demo.sql", demo.Volumes)
	}
	if cmd := strings.Join(demo.Command, " "); !strings.HasPrefix(cmd, "psql ") || !strings.Contains(cmd, "ON_ERROR_STOP=1 -f /demo.sql") ||
		demo.Command[len(demo.Command)-1] != lp.Environment["LEAFPROXY_STORE"] {
		t.Errorf("demo runs %v, want psql -f /demo.sql on the store", demo.Command)
	}
	if demo.DependsOn["migrate"].Condition != "service_completed_successfully" || lp.DependsOn["demo"].Condition != "service_completed_successfully" {
		t.Errorf("demo must run after migrate and before leafproxy: %+v %+v", demo.DependsOn, lp.DependsOn)
	}
	sql := repoFile(t, "scripts/demo.sql")
	for _, want := range []string{"'audit'", "CREATE TABLE IF NOT EXISTS orders"} {
		if !strings.Contains(sql, want) {
			t.Errorf("scripts/demo.sql lacks %s", want)
		}
	}
	// The same snowflake tag and fill rule as make run.
	if lp.Environment["LEAFPROXY_SNOWFLAKE_TAGS"] != "order" || lp.Environment["LEAFPROXY_FILL"] != "orders.id=order" ||
		!strings.Contains(runSh, "--snowflake-tags order --fill orders.id=order") {
		t.Errorf("compose and make run serve different demos: %v", lp.Environment)
	}
	// Every URL, in the comments too, is quoted, so that a shell does not glob its '?'.
	for i, line := range strings.Split(text, "\n") {
		for _, m := range regexp.MustCompile(`.?(postgres|https?)://`).FindAllString(line, -1) {
			if m[0] != '"' {
				t.Errorf("docker-compose.yml:%d: unquoted URL: %s", i+1, strings.TrimSpace(line))
			}
		}
	}
	if dsn := mig.Command[len(mig.Command)-1]; dsn != lp.Environment["LEAFPROXY_STORE"] {
		t.Errorf("migrate uses %q, leafproxy's store is %q", dsn, lp.Environment["LEAFPROXY_STORE"])
	}
	envNames := map[string]bool{}
	for _, n := range config.Names() {
		envNames[config.EnvName(n)] = true
	}
	for k := range lp.Environment {
		if !envNames[k] {
			t.Errorf("leafproxy's environment sets %s, which is no setting", k)
		}
	}
	for _, p := range lp.Ports {
		if !strings.HasPrefix(p, "127.0.0.1:") {
			t.Errorf("port %s is published on every interface of the host", p)
		}
	}
	if hc := lp.Healthcheck; hc == nil || !strings.Contains(strings.Join(hc.Test, " "), "leafproxy healthcheck") {
		t.Errorf("leafproxy's healthcheck should run `leafproxy healthcheck`: %+v", hc)
	}
	// `docker compose config` validates the file fully where the plugin is installed.
	if out, err := exec.Command("docker", "compose", "version").CombinedOutput(); err == nil {
		cmd := exec.Command("docker", "compose", "-f", filepath.Join("..", "..", "docker-compose.yml"), "config", "--quiet")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("docker compose config: %v\n%s", err, out)
		}
	} else {
		t.Logf("docker compose not available (%s): checked the file's structure only", strings.TrimSpace(string(out)))
	}
}

// TestRunScriptSyntax: scripts/run.sh parses (and passes shellcheck where installed), and
// says that the first build takes long before it starts it.
func TestRunScriptSyntax(t *testing.T) {
	text := repoFile(t, "scripts/run.sh")
	say := strings.Index(text, "the first build compiles PostgreSQL's C parser")
	build := strings.Index(text, `"$GO" build`)
	if say < 0 || build < 0 || say > build {
		t.Error("scripts/run.sh does not announce the long first build before it starts it")
	}
	script := filepath.Join("..", "..", "scripts", "run.sh")
	if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", script).CombinedOutput(); err != nil {
			t.Errorf("shellcheck: %v\n%s", err, out)
		}
	}
}
