package proxy

import (
	"fmt"
	"testing"
)

// TestZoneCache checks that a session's TimeZone is loaded from the zone database once
// and shared (time.LoadLocation returns a new location, read from a file, every time),
// that an unknown zone is remembered as nil, and that the cache stops growing at its
// bound while still answering.
func TestZoneCache(t *testing.T) {
	z := zoneCache{max: 3}
	first := z.load("Europe/Paris")
	if first == nil || first.String() != "Europe/Paris" {
		t.Fatalf("load(Europe/Paris) = %v", first)
	}
	if again := z.load("Europe/Paris"); again != first {
		t.Fatal("the zone was loaded again instead of shared")
	}
	if loc := z.load("Not/AZone"); loc != nil {
		t.Fatalf("load of an unknown zone = %v, want nil", loc)
	}
	if _, ok := z.locs["Not/AZone"]; !ok {
		t.Fatal("the unknown zone was not remembered")
	}
	for i := range 5 {
		name := fmt.Sprintf("Etc/GMT+%d", i+1)
		if loc := z.load(name); loc == nil || loc.String() != name {
			t.Fatalf("load(%s) = %v", name, loc)
		}
	}
	if len(z.locs) != 3 {
		t.Fatalf("the cache holds %d zones, want its bound 3", len(z.locs))
	}
}
