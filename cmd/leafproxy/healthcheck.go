package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/leafproxy/leafproxy/internal/config"
)

func healthcheckCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("healthcheck", "healthcheck [--http ADDR] [--path /readyz]\n\nAsks a running leafproxy's admin server and exits 0 when it answers 200: a container\nhealth probe that needs no curl in the image.", stderr)
	addr := fs.String("http", "", "admin address of the proxy (env LEAFPROXY_HTTP; default "+config.DefaultHTTP+")")
	path := fs.String("path", "/readyz", "`PATH` to ask: /readyz (can issue IDs) or /healthz (process alive)")
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this `DURATION`")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	if *addr == "" {
		*addr = os.Getenv("LEAFPROXY_HTTP")
	}
	if *addr == "" {
		*addr = config.DefaultHTTP
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+probeAddr(*addr)+*path, nil)
	if err != nil {
		return usageError("healthcheck: %v", err)
	}
	if tok := os.Getenv("LEAFPROXY_HTTP_TOKEN"); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		// The body says why ("not ready: upstream … unreachable …"); say it first.
		return fmt.Errorf("%s (%s answered %s)", strings.TrimSpace(string(body)), req.URL, resp.Status)
	}
	fmt.Fprint(stdout, string(body))
	return nil
}

// probeAddr turns a listen address into one to dial: a server listening on all interfaces
// is reached on loopback.
func probeAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
