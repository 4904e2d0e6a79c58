package main

import (
	"net"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/internal/config"
)

func TestAdvertisedAddr(t *testing.T) {
	hostIP := firstNonLoopbackIP()
	for _, tc := range []struct {
		listen, advertise, want string
	}{
		{"127.0.0.1:6432", "", hostIP + ":6432"},
		{"localhost:7000", "", hostIP + ":7000"},
		{"0.0.0.0:6432", "", hostIP + ":6432"},
		{":6432", "", hostIP + ":6432"},
		{"[::]:6432", "", hostIP + ":6432"},
		{"10.1.2.3:6432", "", "10.1.2.3:6432"},
		{"127.0.0.1:6432", "192.0.2.7:9", "192.0.2.7:9"},
	} {
		a := &app{cfg: &config.Config{Listen: tc.listen, AdvertisedAddr: tc.advertise}}
		if got := a.advertisedAddr(); got != tc.want {
			t.Errorf("listen %q advertise %q: %q, want %q", tc.listen, tc.advertise, got, tc.want)
		}
	}
	if ip := net.ParseIP(hostIP); ip == nil || (ip.IsLoopback() && hostIP != "127.0.0.1") || strings.Contains(hostIP, ":") {
		t.Errorf("firstNonLoopbackIP() = %q, want an IPv4 address", hostIP)
	}
}

func TestProbeAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0.0.0.0:8080":  "127.0.0.1:8080",
		":8080":         "127.0.0.1:8080",
		"[::]:8080":     "127.0.0.1:8080",
		"10.0.0.5:8080": "10.0.0.5:8080",
		"localhost:9":   "localhost:9",
		"[::1]:8080":    "[::1]:8080",
	} {
		if got := probeAddr(in); got != want {
			t.Errorf("probeAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
