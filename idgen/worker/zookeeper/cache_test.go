package zookeeper

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCacheFile(t *testing.T) {
	dir := t.TempDir()
	c := newCacheFile(dir, "leaf", "8080")
	if want := filepath.Join(dir, "leaf", "leafconf", "8080", "workerID.properties"); c.path != want {
		t.Fatalf("path %s, want Leaf's %s", c.path, want)
	}
	if _, _, err := c.read(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read of a missing file = %v", err)
	}
	if err := c.write(17, 1767225600000); err != nil {
		t.Fatal(err)
	}
	if id, ts, err := c.read(); err != nil || id != 17 || ts != 1767225600000 {
		t.Fatalf("read back %d %d %v", id, ts, err)
	}
	for _, tc := range []struct {
		name, content string
		id, ts        int64
		ok            bool
	}{
		{"Leaf's own file", "workerID=3", 3, 0, true},
		{"comments and spaces", "#written by Leaf\n workerID = 4 \n", 4, 0, true},
		{"colon separator", "workerID:5\ntimestamp:6", 5, 6, true},
		{"no workerID", "timestamp=6", 0, 0, false},
		{"garbage", "workerID=x", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(c.path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			id, ts, err := c.read()
			if tc.ok != (err == nil) || tc.ok && (id != tc.id || ts != tc.ts) {
				t.Fatalf("read %q = %d, %d, %v", tc.content, id, ts, err)
			}
		})
	}
}
