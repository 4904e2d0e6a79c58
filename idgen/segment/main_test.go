package segment_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every engine a test starts is closed by its cleanup; a goroutine left behind (a loader,
// the refresh loop) is a bug in Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
