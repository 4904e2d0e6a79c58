package rewrite

import (
	"errors"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
	"google.golang.org/protobuf/encoding/protowire"
)

// scanToken is one token of PostgreSQL's scanner: the byte range
// [Start, End) of the text and the token's kind.
type scanToken struct {
	Start, End int32
	Token      pg_query.Token
	Keyword    bool // the scanner read it as a keyword of any kind
}

// Field numbers of pg_query's ScanResult and ScanToken messages.
const (
	scanResultTokens  = 2
	scanTokenStart    = 1
	scanTokenEnd      = 2
	scanTokenKind     = 4
	scanTokenKeywords = 5
)

var errBadScan = errors.New("rewrite: malformed scanner output")

// scan runs PostgreSQL's own scanner over sql and returns every token,
// comments included. It decodes the scanner's protobuf output directly:
// pg_query.Scan would unmarshal one message per token, which costs more
// than scanning.
func scan(sql string) ([]scanToken, error) {
	buf, err := parser.ScanToProtobuf(sql)
	if err != nil {
		return nil, err
	}
	return decodeScan(buf, len(sql), make([]scanToken, 0, 32))
}

// decodeScan appends the tokens of a ScanResult to toks and checks that
// each lies inside a text of n bytes, so that slicing by them cannot panic.
func decodeScan(b []byte, n int, toks []scanToken) ([]scanToken, error) {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, errBadScan
		}
		b = b[l:]
		if num == scanResultTokens && typ == protowire.BytesType {
			msg, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, errBadScan
			}
			b = b[l:]
			t, ok := decodeToken(msg)
			if !ok || t.Start < 0 || t.Start > t.End || int(t.End) > n {
				return nil, errBadScan
			}
			toks = append(toks, t)
			continue
		}
		if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
			return nil, errBadScan
		}
		b = b[l:]
	}
	return toks, nil
}

// decodeToken decodes one ScanToken. All its fields are varints with
// one-byte keys, which it reads inline: this runs for every token of every
// statement the shape cache serves.
func decodeToken(b []byte) (scanToken, bool) {
	var t scanToken
	for i := 0; i < len(b); {
		key := b[i]
		if key >= 0x80 || protowire.Type(key&7) != protowire.VarintType {
			return decodeTokenFields(b)
		}
		i++
		var v uint64
		for shift := uint(0); ; shift += 7 {
			if i >= len(b) || shift > 63 {
				return t, false
			}
			c := b[i]
			i++
			v |= uint64(c&0x7f) << shift
			if c < 0x80 {
				break
			}
		}
		t.set(protowire.Number(key>>3), v)
	}
	return t, true
}

// decodeTokenFields decodes a ScanToken with fields of any kind, which a
// later pg_query might add.
func decodeTokenFields(b []byte) (scanToken, bool) {
	var t scanToken
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return t, false
		}
		b = b[l:]
		if typ != protowire.VarintType {
			if l = protowire.ConsumeFieldValue(num, typ, b); l < 0 {
				return t, false
			}
			b = b[l:]
			continue
		}
		v, l := protowire.ConsumeVarint(b)
		if l < 0 {
			return t, false
		}
		b = b[l:]
		t.set(num, v)
	}
	return t, true
}

func (t *scanToken) set(num protowire.Number, v uint64) {
	switch num {
	case scanTokenStart:
		t.Start = int32(v)
	case scanTokenEnd:
		t.End = int32(v)
	case scanTokenKind:
		t.Token = pg_query.Token(v)
	case scanTokenKeywords:
		t.Keyword = pg_query.KeywordKind(v) != pg_query.KeywordKind_NO_KEYWORD
	}
}

// withoutComments returns the tokens the planner works on: all but
// comments. It filters all in place.
func withoutComments(all []scanToken) tokens {
	toks := all[:0]
	for _, t := range all {
		if t.Token != pg_query.Token_SQL_COMMENT && t.Token != pg_query.Token_C_COMMENT {
			toks = append(toks, t)
		}
	}
	return toks
}

// isKeyword reports whether PostgreSQL's scanner reads name as a keyword.
func isKeyword(name string) bool {
	toks, err := scan(name)
	if err != nil || len(toks) != 1 {
		return true
	}
	return toks[0].Keyword
}
