package proxy

import (
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
)

// Custom settings (a name with a dot: SET app.tenant = 42, the usual way to hand a value
// to row-level security policies) are not listed by pg_settings, so captureSQL cannot
// find them: they stayed on the server connection, for the next client to see. The proxy
// learns their names from the client's SET statements (a SET whose name has a dot) and
// reads them back, carries them and resets them for other clients, like the settings
// pg_settings lists. A set_config call the client sends (not one in a server-side
// function) is noted too: it makes the session read its settings back, as a SET does.

// maxCustomSettings bounds the custom setting names one client's session keeps.
const maxCustomSettings = 64

// noteCustomSettings notes the names of the custom settings the SET statements and the
// set_config calls of sql change, as scanTxWords found them likely. Called with mu held.
func (v *pooledConn) noteCustomSettings(sql string, setConfig, set bool) {
	if setConfig {
		v.noteSetConfig(sql)
	}
	if !set {
		return
	}
	tree, err := pg_query.Parse(sql)
	if err != nil {
		return
	}
	for _, raw := range tree.GetStmts() {
		if set := raw.GetStmt().GetVariableSetStmt(); set != nil {
			v.noteCustom(set.GetName())
		}
	}
}

// noteCustom notes name when it is a custom setting's. Called with mu held.
func (v *pooledConn) noteCustom(name string) {
	if !strings.Contains(name, ".") || len(v.custom) >= maxCustomSettings {
		return
	}
	name = strings.ToLower(name)
	if !v.custom[name] {
		if v.custom == nil {
			v.custom = make(map[string]bool)
		}
		v.custom[name] = true
		v.customSQL = ""
	}
}

// noteSetConfig looks at the set_config calls of sql, with the lexer: one that is not
// local (its last argument is not the literal true) makes the session read its settings
// back when its transaction ends, as a SET does, and a custom setting it names with a
// string literal is noted. Called with mu held.
func (v *pooledConn) noteSetConfig(sql string) {
	scan, err := pg_query.Scan(sql)
	if err != nil {
		return
	}
	toks := scan.GetTokens()
	text := func(t *pg_query.ScanToken) string { return sql[t.GetStart():t.GetEnd()] }
	for i := 0; i+1 < len(toks); i++ {
		if !strings.EqualFold(text(toks[i]), "set_config") || toks[i+1].GetToken() != pg_query.Token_ASCII_40 {
			continue
		}
		depth, last := 0, -1
		for j := i + 1; j < len(toks); j++ {
			switch text(toks[j]) {
			case "(":
				depth++
			case ")":
				depth--
			}
			if depth == 0 {
				last = j - 1
				break
			}
		}
		if last >= 0 && strings.EqualFold(text(toks[last]), "true") {
			continue // set_config(…, true) ends with the transaction
		}
		v.needCapture = true
		if i+2 < len(toks) && toks[i+2].GetToken() == pg_query.Token_SCONST {
			if lit := text(toks[i+2]); len(lit) >= 2 && lit[0] == '\'' {
				v.noteCustom(strings.ReplaceAll(lit[1:len(lit)-1], "''", "'"))
			}
		}
	}
}

// hasWordAt reports whether w, a lower-case ASCII word, is at sql[i:] in any case. It
// compares byte by byte, ASCII letters folded: what strings.EqualFold makes of as many
// bytes as w has (a multi-byte character among them never matches), without making a
// string of them first; scanTxWords calls it at most letters of every statement.
func hasWordAt[T string | []byte](sql T, i int, w string) bool {
	if len(sql)-i < len(w) {
		return false
	}
	for j := range len(w) {
		c := sql[i+j]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != w[j] {
			return false
		}
	}
	return true
}

// customSetAt reports whether a SET (or RESET) of a name with a dot is at sql[i:].
func customSetAt[T string | []byte](sql T, i int) bool {
	if !hasWordAt(sql, i, "set") {
		return false
	}
	start := i
	if start >= 2 && hasWordAt(sql, start-2, "re") {
		start -= 2 // RESET
	}
	if start > 0 && identByte(sql[start-1]) {
		return false
	}
	j := i + 3
	for range 2 {
		k := skipSpace(sql, j)
		if k == j {
			break // SET must be followed by a space
		}
		j = k
		if w := wordLen(sql, j); w > 0 && (hasWordAt(sql, j, "session") && w == 7 || hasWordAt(sql, j, "local") && w == 5) {
			j += w
			continue
		}
		break
	}
	for ; j < len(sql) && (identByte(sql[j]) || sql[j] == '"' || sql[j] == '.'); j++ {
		if sql[j] == '.' {
			return true
		}
	}
	return false
}

func identByte(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c|('a'-'A') >= 'a' && c|('a'-'A') <= 'z' || c >= 0x80
}

func skipSpace[T string | []byte](s T, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f') {
		i++
	}
	return i
}

func wordLen[T string | []byte](s T, i int) int {
	j := i
	for j < len(s) && identByte(s[j]) {
		j++
	}
	return j - i
}

// captureQuery returns captureSQL, and the custom settings the client set.
func (v *pooledConn) captureQuery() string {
	if len(v.custom) == 0 {
		return captureSQL
	}
	if v.customSQL == "" {
		names := make([]string, 0, len(v.custom))
		for n := range v.custom {
			names = append(names, quoteLiteral(n))
		}
		v.customSQL = captureSQL + " UNION ALL SELECT n, pg_catalog.current_setting(n, true) FROM pg_catalog.unnest(ARRAY[" +
			strings.Join(names, ", ") + "]::text[]) AS n WHERE pg_catalog.current_setting(n, true) IS NOT NULL"
	}
	return v.customSQL
}
