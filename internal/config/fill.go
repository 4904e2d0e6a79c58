package config

import (
	"fmt"
	"strings"
)

// FillRule says: on INSERT into Schema.Table without Column, add Column with an ID of Tag.
// Names are as PostgreSQL stores them: unquoted identifiers folded to lower case, quoted
// ones verbatim. Schema is empty when the rule names no schema (any schema on the
// search_path matches).
type FillRule struct {
	Schema string
	Table  string
	Column string
	Tag    string
}

// QualifiedTable returns [schema.]table for messages.
func (r FillRule) QualifiedTable() string {
	if r.Schema == "" {
		return r.Table
	}
	return r.Schema + "." + r.Table
}

// String returns the rule in the form ParseFillRule reads, names quoted where needed.
func (r FillRule) String() string {
	return r.SQLTable() + "." + r.SQLColumn() + "=" + r.Tag
}

// ParseFillRule reads "[schema.]table.column=tag". Identifiers may be double-quoted
// ("Order Lines".id=line) to keep their case or hold dots.
func ParseFillRule(s string) (FillRule, error) {
	eq := strings.LastIndexByte(s, '=')
	if eq < 0 {
		return FillRule{}, fmt.Errorf("rule %q: want [schema.]table.column=tag", s)
	}
	path, tag := strings.TrimSpace(s[:eq]), strings.TrimSpace(s[eq+1:])
	if err := CheckTagName(tag); err != nil {
		return FillRule{}, fmt.Errorf("rule %q: %w", s, err)
	}
	parts, err := splitIdentifiers(path)
	if err != nil {
		return FillRule{}, fmt.Errorf("rule %q: %w", s, err)
	}
	switch len(parts) {
	case 2:
		return FillRule{Table: parts[0], Column: parts[1], Tag: tag}, nil
	case 3:
		return FillRule{Schema: parts[0], Table: parts[1], Column: parts[2], Tag: tag}, nil
	}
	return FillRule{}, fmt.Errorf("rule %q: want table.column or schema.table.column before '=', got %d names", s, len(parts))
}

// splitIdentifiers splits a dotted SQL name, folding unquoted parts to lower case.
func splitIdentifiers(s string) ([]string, error) {
	var parts []string
	for {
		var part string
		if strings.HasPrefix(s, `"`) {
			var b strings.Builder
			i := 1
			for {
				j := strings.IndexByte(s[i:], '"')
				if j < 0 {
					return nil, fmt.Errorf("unterminated quoted name")
				}
				b.WriteString(s[i : i+j])
				i += j + 1
				if i < len(s) && s[i] == '"' { // "" is a quote inside the name
					b.WriteByte('"')
					i++
					continue
				}
				break
			}
			part, s = b.String(), s[i:]
		} else {
			j := strings.IndexByte(s, '.')
			if j < 0 {
				j = len(s)
			}
			part, s = strings.ToLower(s[:j]), s[j:]
			if strings.ContainsAny(part, `" `) {
				return nil, fmt.Errorf("bad name %q (quote names holding spaces or quotes)", part)
			}
		}
		if part == "" {
			return nil, fmt.Errorf("empty name")
		}
		parts = append(parts, part)
		if s == "" {
			return parts, nil
		}
		if s[0] != '.' {
			return nil, fmt.Errorf("expected '.' after %q", part)
		}
		s = s[1:]
	}
}
