package zookeeper

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cacheFile is Leaf's local copy of the worker ID, used when ZooKeeper is unreachable at
// start: {dir}/{name}/leafconf/{port}/workerID.properties in Java properties format. Leaf
// writes only workerID; timestamp (the high-water mark in Unix ms) is ours, and a file
// without it is accepted with a mark of 0.
type cacheFile struct {
	path string
}

func newCacheFile(dir, name, port string) cacheFile {
	return cacheFile{path: filepath.Join(dir, name, "leafconf", port, "workerID.properties")}
}

// read returns the cached worker ID and timestamp; os.ErrNotExist when there is no file.
func (c cacheFile) read() (workerID, timestamp int64, err error) {
	data, err := os.ReadFile(c.path)
	if err != nil {
		return 0, 0, err
	}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			key, value, ok = strings.Cut(line, ":")
		}
		if !ok {
			continue
		}
		n, perr := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch strings.TrimSpace(key) {
		case "workerID":
			if perr != nil {
				return 0, 0, fmt.Errorf("%s: bad workerID %q", c.path, value)
			}
			workerID, found = n, true
		case "timestamp":
			if perr != nil {
				return 0, 0, fmt.Errorf("%s: bad timestamp %q", c.path, value)
			}
			timestamp = n
		}
	}
	if !found {
		return 0, 0, fmt.Errorf("%s: no workerID", c.path)
	}
	return workerID, timestamp, nil
}

// write replaces the file atomically, so a crash never leaves half of it.
func (c cacheFile) write(workerID, timestamp int64) error {
	if err := os.MkdirAll(filepath.Dir(c.path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.path), ".workerID-*.tmp")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(tmp, "workerID=%d\ntimestamp=%d\n", workerID, timestamp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
