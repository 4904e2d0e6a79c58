package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// stateFile is the static source's high-water mark on disk, and the lock that makes one
// process its only writer. The lock is on a file of its own: the mark is replaced by
// rename, which would leave a lock on the old inode while a newcomer locks the new one.
type stateFile struct {
	id   int64
	path string   // {dir}/worker-{id}.highwater
	lock *os.File // {dir}/worker-{id}.lock, flock'ed exclusively
}

// openState creates dir when missing and locks the ID's lock file, failing with ErrInUse
// when another process holds it.
func openState(dir string, id int64) (*stateFile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("worker: state directory of static worker %d: %w", id, err)
	}
	name := "worker-" + strconv.FormatInt(id, 10)
	lockPath := filepath.Join(dir, name+".lock")
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("worker: lock file of static worker %d: %w", id, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked: another process runs with static worker ID %d and this state directory",
				ErrInUse, lockPath, id)
		}
		return nil, fmt.Errorf("worker: locking %s: %w", lockPath, err)
	}
	return &stateFile{id: id, path: filepath.Join(dir, name+".highwater"), lock: f}, nil
}

// unlock releases the lock (closing the descriptor drops the flock).
func (s *stateFile) unlock() { s.lock.Close() }

// read returns the recorded mark in Unix ms; 0 when there is no file yet.
func (s *stateFile) read() (int64, error) {
	data, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("worker: reading the high-water mark of static worker %d: %w", s.id, err)
	}
	hw, err := parseState(data, s.id)
	if err != nil {
		return 0, fmt.Errorf("%w %s: %v; check the clock, then fix or remove the file", ErrBadState, s.path, err)
	}
	return hw, nil
}

// parseState reads the properties workerID (must be id) and timestamp (Unix ms, >= 0),
// both required; comments and blank lines are skipped, any other line is an error.
func parseState(data []byte, id int64) (int64, error) {
	var gotID, gotTS bool
	var ts int64
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return 0, fmt.Errorf("line %d: %q is not key=value", n, line)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(value), 10, 64)
		switch key = strings.TrimSpace(key); {
		case key != "workerID" && key != "timestamp":
			return 0, fmt.Errorf("line %d: unknown key %q", n, key)
		case err != nil || v < 0:
			return 0, fmt.Errorf("line %d: %s %q is not a non-negative integer", n, key, strings.TrimSpace(value))
		case key == "workerID":
			if v != id {
				return 0, fmt.Errorf("line %d: it is for worker ID %d, not %d", n, v, id)
			}
			gotID = true
		default:
			ts, gotTS = v, true
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if !gotID || !gotTS {
		return 0, errors.New("want workerID and timestamp lines")
	}
	return ts, nil
}

// write replaces the file with the mark hw: a temporary file, synced, renamed over the
// old one, and the directory synced, so that a crash leaves the old mark or the new one,
// never a torn file or a rename lost with the directory entry.
func (s *stateFile) write(hw int64) error {
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(s.path)+"-*.tmp")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(tmp, "workerID=%d\ntimestamp=%d\n", s.id, hw)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), s.path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
