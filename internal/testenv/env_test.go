package testenv

import (
	"fmt"
	"strings"
	"testing"
)

func TestFreePortHonoursThePortRange(t *testing.T) {
	t.Setenv(EnvPorts, "20000-20009")
	for range 50 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 20000 || port > 20009 {
			t.Fatalf("FreePort = %d, outside %s=20000-20009", port, EnvPorts)
		}
	}
}

func TestFreePortDefaultRange(t *testing.T) {
	t.Setenv(EnvPorts, "")
	lo, hi, err := portRange()
	if err != nil || lo != 10000 || hi < lo+1000 || hi > 32767 {
		t.Fatalf("default range %d-%d, %v", lo, hi, err)
	}
}

func TestParsePortRange(t *testing.T) {
	for _, tt := range []struct {
		in     string
		lo, hi int
	}{
		{"20000-29999", 20000, 29999},
		{" 2000 - 2000 ", 2000, 2000},
	} {
		lo, hi, err := parsePortRange(tt.in)
		if err != nil || lo != tt.lo || hi != tt.hi {
			t.Errorf("parsePortRange(%q) = %d, %d, %v; want %d, %d", tt.in, lo, hi, err, tt.lo, tt.hi)
		}
	}
	for _, bad := range []string{"20000", "29999-20000", "80-90", "20000-70000", "a-b", "-"} {
		if _, _, err := parsePortRange(bad); err == nil {
			t.Errorf("parsePortRange(%q) accepted", bad)
		}
	}
}

// recordingTB notes how a helper gave up on a test instead of giving up itself.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper()                           {}
func (r *recordingTB) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recordingTB) Skipf(format string, args ...any)  { r.skip = fmt.Sprintf(format, args...) }

func TestSkipOrFailFailsUnderCI(t *testing.T) {
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		r := &recordingTB{TB: t}
		SkipOrFail(r, "no %s on PATH", "frobnicate")
		gave := r.skip
		if ci != "" {
			gave = r.fatal
			if r.skip != "" {
				t.Errorf("CI=%q: skipped (%q)", ci, r.skip)
			}
		} else if r.fatal != "" {
			t.Errorf("CI unset: failed (%q)", r.fatal)
		}
		if !strings.Contains(gave, "no frobnicate on PATH") {
			t.Errorf("CI=%q: message %q does not say what is missing", ci, gave)
		}
	}
}
