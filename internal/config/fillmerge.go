package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrFillConflict reports two fill rules that cannot both hold: one column filled from two
// tags, or one table with two key columns. Test for it with errors.Is.
var ErrFillConflict = errors.New("conflicting fill rules")

// SourcedFillRule is a fill rule and where it was read from, for messages.
type SourcedFillRule struct {
	FillRule
	Origin string // e.g. "config" or "store"
}

// MergeFillRules merges rule sets read from several places (the configuration, the store)
// into one, in a stable order (by table, then column). A rule given more than once with
// the same tag counts once. Every conflict is reported, joined into one error wrapping
// ErrFillConflict; then the merged set is nil, so that a caller keeps the rules it has.
func MergeFillRules(sets ...[]SourcedFillRule) ([]FillRule, error) {
	byTable := map[[2]string]SourcedFillRule{}
	var errs []error
	for _, set := range sets {
		for _, r := range set {
			key := [2]string{r.Schema, r.Table}
			prev, seen := byTable[key]
			switch {
			case !seen:
				byTable[key] = r
			case prev.Column != r.Column:
				errs = append(errs, fmt.Errorf("%w: table %s has two key columns: %s (%s) and %s (%s)",
					ErrFillConflict, r.QualifiedTable(), prev.FillRule, prev.Origin, r.FillRule, r.Origin))
			case prev.Tag != r.Tag:
				errs = append(errs, fmt.Errorf("%w: %s.%s is filled from two tags: %s (%s) and %s (%s)",
					ErrFillConflict, r.QualifiedTable(), r.Column, prev.FillRule, prev.Origin, r.FillRule, r.Origin))
			}
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	rules := make([]FillRule, 0, len(byTable))
	for _, r := range byTable {
		rules = append(rules, r.FillRule)
	}
	sort.Slice(rules, func(i, j int) bool {
		a, b := rules[i], rules[j]
		if a.Schema != b.Schema {
			return a.Schema < b.Schema
		}
		if a.Table != b.Table {
			return a.Table < b.Table
		}
		return a.Column < b.Column
	})
	return rules, nil
}

// Sourced labels every rule of rules with origin.
func Sourced(rules []FillRule, origin string) []SourcedFillRule {
	out := make([]SourcedFillRule, len(rules))
	for i, r := range rules {
		out[i] = SourcedFillRule{FillRule: r, Origin: origin}
	}
	return out
}

// SQLTable returns [schema.]table with each name double-quoted when it is not a plain
// lower-case identifier, so that ParseFillTarget reads it back unchanged.
func (r FillRule) SQLTable() string {
	if r.Schema == "" {
		return QuoteName(r.Table)
	}
	return QuoteName(r.Schema) + "." + QuoteName(r.Table)
}

// SQLColumn returns the column, double-quoted when it is not a plain lower-case identifier.
func (r FillRule) SQLColumn() string { return QuoteName(r.Column) }

// QuoteName double-quotes name unless it reads back unchanged without quotes: a
// lower-case letter or underscore followed by lower-case letters, digits, _ or $.
func QuoteName(name string) string {
	plain := name != ""
	for i, c := range name {
		ok := c == '_' || c >= 'a' && c <= 'z' || i > 0 && (c >= '0' && c <= '9' || c == '$')
		plain = plain && ok
	}
	if plain {
		return name
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// ParseFillTarget reads "[schema.]table.column", the left side of a fill rule, as the
// `leafproxy fill remove` argument.
func ParseFillTarget(s string) (FillRule, error) {
	parts, err := splitIdentifiers(strings.TrimSpace(s))
	if err != nil {
		return FillRule{}, fmt.Errorf("%q: %w", s, err)
	}
	switch len(parts) {
	case 2:
		return FillRule{Table: parts[0], Column: parts[1]}, nil
	case 3:
		return FillRule{Schema: parts[0], Table: parts[1], Column: parts[2]}, nil
	}
	return FillRule{}, fmt.Errorf("%q: want table.column or schema.table.column, got %d names", s, len(parts))
}

// FillRuleFromStore builds a rule from a leaf_fill row: table_name is [schema.]table and
// column_name a column, quoted as SQLTable and SQLColumn write them.
func FillRuleFromStore(table, column, tag string) (FillRule, error) {
	r, err := ParseFillRule(table + "." + column + "=" + tag)
	if err != nil {
		return FillRule{}, fmt.Errorf("leaf_fill row (%q, %q, %q): %w", table, column, tag, err)
	}
	return r, nil
}
