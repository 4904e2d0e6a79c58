package rewrite

import "math/bits"

// SameButNumbers reports whether a and b are one text but for the digits of their
// numbers: with every run of ASCII digits in each replaced by a single 0, they are
// equal. Clients that put their values in the text of each statement (the simple
// protocol of psql scripts, psycopg2, ORMs without server-side prepares) send such texts
// again and again: "… WHERE id = 17" and "… WHERE id = 4242".
//
// Between their numbers two such texts have the same bytes, and each number of one
// stands where the other has a number. No word the prefilter looks for has a digit in
// it, so each lies between numbers, and the two texts have the same words, each with a
// digit beside it in one text where the other has one too (see Rewriter.Prefiltered).
// Texts of one length are compared as they are, then eight bytes at a time for
// differences only where both have a digit; other texts, eight bytes at a time up to
// each difference, where the runs of digits are passed over.
func SameButNumbers[A, B string | []byte](a A, b B) bool {
	if len(a) == len(b) {
		if string(a) == string(b) {
			return true // one comparison of the bytes, however long the texts
		}
		if len(a) >= 8 && differInDigits(a, b) {
			return true // the common case: the numbers have as many digits as before
		}
	}
	i, j := 0, 0
	for {
		// Up to the next difference: eight bytes at a time, then one by one.
		for len(a)-i >= 8 && len(b)-j >= 8 {
			if d := word(a, i) ^ word(b, j); d != 0 {
				k := bits.TrailingZeros64(d) / 8 // the first byte that differs
				i, j = i+k, j+k
				break
			}
			i, j = i+8, j+8
		}
		for i < len(a) && j < len(b) && a[i] == b[j] {
			i, j = i+1, j+1
		}
		// A difference, or the end of one text or both: it must be inside a number of
		// each, whose digits are passed over.
		inNumber := i > 0 && isDigit(a[i-1]) // so is b[j-1], equal to it or the end of a number too
		aDigit := i < len(a) && isDigit(a[i])
		bDigit := j < len(b) && isDigit(b[j])
		if !(inNumber && (aDigit || bDigit)) && !(aDigit && bDigit) {
			return i == len(a) && j == len(b)
		}
		i, j = skipDigits(a, i), skipDigits(b, j)
	}
}

func isDigit(c byte) bool { return c-'0' < 10 }

// differInDigits reports whether a and b, of one length of eight bytes or more, differ
// only where both have a digit, eight bytes at a time (the last eight overlap the ones
// before when the length is no multiple of eight). Their numbers then stand in the same
// places; when it reports false, they may still be the same but for numbers of other
// lengths.
func differInDigits[A, B string | []byte](a A, b B) bool {
	n := len(a)
	b = b[:n]
	i := 0
	for ; i <= n-8; i += 8 {
		if wa, wb := word(a, i), word(b, i); wa != wb && !onlyDigitsDiffer(wa, wb) {
			return false
		}
	}
	if i == n {
		return true
	}
	wa, wb := word(a, n-8), word(b, n-8)
	return wa == wb || onlyDigitsDiffer(wa, wb)
}

// onlyDigitsDiffer reports whether the words wa and wb differ only in bytes where both
// have a digit.
func onlyDigitsDiffer(wa, wb uint64) bool {
	return nonZeroBytes(wa^wb)&^(digitBytes(wa)&digitBytes(wb)) == 0
}

const (
	ones  = 0x0101010101010101
	low7  = 0x7f * ones
	highs = 0x80 * ones
)

// nonZeroBytes returns the bytes of x that are not zero, as the high bit of each: no
// carry crosses from one byte to the next, as x&low7 + low7 stays under 0x100.
func nonZeroBytes(x uint64) uint64 { return ((x&low7 + low7) | x) & highs }

// digitBytes returns the bytes of w that are ASCII digits, as the high bit of each.
func digitBytes(w uint64) uint64 { return ^notDigitBytes(w) & highs }

// notDigitBytes returns the bytes of w that are not ASCII digits, as the high bit of
// each.
func notDigitBytes(w uint64) uint64 {
	t := w ^ '0'*ones // a digit becomes 0 to 9, and no other byte does
	// The high bit of each byte of t from 10 on: no carry crosses from one byte to the
	// next, as t&low7 + 0x76 stays under 0x100.
	return ((t&low7 + (0x80-10)*ones) | t) & highs
}

// skipDigits returns the end of the run of digits of s at i, eight bytes at a time.
func skipDigits[T string | []byte](s T, i int) int {
	for len(s)-i >= 8 {
		n := leadingDigits(word(s, i))
		i += n
		if n < 8 {
			return i
		}
	}
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

// leadingDigits returns how many of the bytes of w, from its first (least significant)
// on, are ASCII digits.
func leadingDigits(w uint64) int { return bits.TrailingZeros64(notDigitBytes(w)) / 8 }
