package proxy

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any test leaves a goroutine behind: every session's two
// goroutines, cancel forwarders and accept loops must end with their connections.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
