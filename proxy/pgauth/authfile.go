package pgauth

import (
	"fmt"
	"strings"
)

// ParseAuthFile reads a PgBouncer auth_file (userlist.txt): one `"user" "secret"` line per
// user, each field in double quotes with a double quote inside written twice; blank lines
// and lines starting with ';' (or '#') are ignored, and so is anything after the secret on
// its line. The secret is plaintext, md5 or SCRAM (see ParseSecret). A later line for the
// same user wins.
func ParseAuthFile(data string) (map[string]Secret, error) {
	users := make(map[string]Secret)
	for n, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == ';' || line[0] == '#' {
			continue
		}
		user, rest, err := quoted(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: user name: %v", n+1, err)
		}
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return nil, fmt.Errorf("line %d: no secret after the user name", n+1)
		}
		secret, _, err := quoted(rest)
		if err != nil {
			return nil, fmt.Errorf("line %d: secret: %v", n+1, err)
		}
		if user == "" {
			return nil, fmt.Errorf("line %d: empty user name", n+1)
		}
		users[user] = ParseSecret(secret)
	}
	return users, nil
}

// quoted reads a double-quoted field at the start of s, where "" stands for one ", and
// returns it and what follows it.
func quoted(s string) (field, rest string, err error) {
	if s == "" || s[0] != '"' {
		return "", "", fmt.Errorf("want a double-quoted field, got %q", s)
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		if s[i] != '"' {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '"' {
			b.WriteByte('"')
			i++
			continue
		}
		return b.String(), s[i+1:], nil
	}
	return "", "", fmt.Errorf("no closing double quote in %q", s)
}

// QuoteAuthField quotes a user name or secret for an auth file.
func QuoteAuthField(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
