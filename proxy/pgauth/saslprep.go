package pgauth

import (
	"unicode/utf8"

	"github.com/xdg-go/stringprep"
	"golang.org/x/text/unicode/norm"
)

// saslPrep prepares a password for SCRAM the way PostgreSQL does on both sides of a
// login (pg_saslprep): libpq and the server hash the prepared password, so a secret the
// proxy derives from a plaintext password must be made of the same bytes.
//
// An ASCII password is used as it is. Otherwise RFC 4013's SASLprep applies: non-ASCII
// spaces become spaces, characters "commonly mapped to nothing" go, and the result is
// normalized to NFKC. Where SASLprep would refuse the password (not UTF-8, nothing left,
// a prohibited or unassigned character, right-to-left text mixed with left-to-right),
// PostgreSQL uses the password as it is, and so does saslPrep. As in PostgreSQL, the
// checks look at the mapped characters before normalization.
func saslPrep(password string) string {
	if isASCII(password) || !utf8.ValidString(password) {
		return password
	}
	mapped := make([]rune, 0, len(password))
	for _, r := range password {
		switch {
		case stringprep.TableC1_2.Contains(r): // non-ASCII space
			mapped = append(mapped, ' ')
		case isMappedToNothing(r):
		default:
			mapped = append(mapped, r)
		}
	}
	if len(mapped) == 0 || prohibited(mapped) || !bidiAllowed(mapped) {
		return password
	}
	return norm.NFKC.String(string(mapped))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// isMappedToNothing reports whether r is in RFC 3454's table B.1.
func isMappedToNothing(r rune) bool {
	_, ok := stringprep.TableB1[r]
	return ok
}

// saslProhibited are the tables of characters SASLprep's output may not hold (RFC 4013
// section 2.3) and the unassigned code points of Unicode 3.2 (table A.1), refused
// because a password is a stored string.
var saslProhibited = []stringprep.Set{
	stringprep.TableA1,
	stringprep.TableC1_2, stringprep.TableC2_1, stringprep.TableC2_2, stringprep.TableC3,
	stringprep.TableC4, stringprep.TableC5, stringprep.TableC6, stringprep.TableC7,
	stringprep.TableC8, stringprep.TableC9,
}

func prohibited(rs []rune) bool {
	for _, r := range rs {
		for _, set := range saslProhibited {
			if set.Contains(r) {
				return true
			}
		}
	}
	return false
}

// bidiAllowed applies RFC 3454's rules for bidirectional text (section 6): a string with
// a right-to-left character (table D.1) holds no left-to-right one (D.2), and begins and
// ends with a right-to-left one.
func bidiAllowed(rs []rune) bool {
	rtl := false
	for _, r := range rs {
		if stringprep.TableD1.Contains(r) {
			rtl = true
			break
		}
	}
	if !rtl {
		return true
	}
	for _, r := range rs {
		if stringprep.TableD2.Contains(r) {
			return false
		}
	}
	return stringprep.TableD1.Contains(rs[0]) && stringprep.TableD1.Contains(rs[len(rs)-1])
}
