package pgauth

import "testing"

func TestSASLprep(t *testing.T) {
	for _, tt := range []struct{ name, in, want string }{
		// RFC 4013, section 3.
		{"soft hyphen mapped to nothing", "I\u00adX", "IX"},
		{"no transformation", "user", "user"},
		{"case preserved", "USER", "USER"},
		{"NFKC", "\u00aa", "a"},
		{"NFKC, roman numeral", "\u2168", "IX"},
		{"non-ASCII spaces become spaces", "a\u00a0b\u3000c", "a b c"},
		// PostgreSQL's exceptions: ASCII passes as it is, control characters included,
		// and a password SASLprep refuses is used as it is.
		{"ASCII control character", "a\x07b", "a\x07b"},
		{"prohibited character", "\u00e4\u0007", "\u00e4\u0007"},
		{"unassigned in Unicode 3.2", "\u00e4\u0221", "\u00e4\u0221"},
		{"right-to-left mixed with left-to-right", "\u0627a\u0627", "\u0627a\u0627"},
		{"right-to-left not at both ends", "\u06271", "\u06271"},
		{"right-to-left throughout", "\u0627\u0628", "\u0627\u0628"},
		{"nothing left", "\u00ad\u200d", "\u00ad\u200d"},
		{"not UTF-8", "\xff\u00e4", "\xff\u00e4"},
		// PostgreSQL maps a zero-width space, in both table C.1.2 (non-ASCII spaces)
		// and B.1 (mapped to nothing), to a space.
		{"zero-width space", "a\u200bb\u00e4", "a b\u00e4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := saslPrep(tt.in); got != tt.want {
				t.Fatalf("saslPrep(%+q) = %+q, want %+q", tt.in, got, tt.want)
			}
		})
	}
}

// TestSCRAMSecretPreparesPassword: the secret derived from a password that SASLprep
// changes is the secret of the prepared password, as PostgreSQL stores it.
func TestSCRAMSecretPreparesPassword(t *testing.T) {
	salt := []byte("0123456789abcdef")
	got := SCRAMSecret("\u2168\u00a0p\u00e4ss", salt, 4096)
	want := SCRAMSecret("IX p\u00e4ss", salt, 4096)
	if got.String() != want.String() {
		t.Fatalf("secret of the unprepared password %s, want %s", got, want)
	}
}
