package config

import (
	"fmt"
	"strings"

	"github.com/leafproxy/leafproxy/internal/metrics"
)

// AnyTag in key-types sets the key type of every tag not listed by name.
const AnyTag = "*"

// ParseKeyTypes reads key-types entries TAG=TYPE (TYPE bigint, integer or js; TAG may be
// * for every tag not named) into a map from tag to key type.
func ParseKeyTypes(entries []string) (map[string]metrics.KeyType, error) {
	out := make(map[string]metrics.KeyType, len(entries))
	for _, e := range entries {
		tag, typ, ok := strings.Cut(e, "=")
		tag = strings.TrimSpace(tag)
		if !ok || tag == "" {
			return nil, fmt.Errorf("%q is not TAG=TYPE", e)
		}
		if tag != AnyTag {
			if err := CheckTagName(tag); err != nil {
				return nil, err
			}
		}
		kt, err := metrics.ParseKeyType(typ)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tag, err)
		}
		if _, dup := out[tag]; dup {
			return nil, fmt.Errorf("tag %q has two key types", tag)
		}
		out[tag] = kt
	}
	return out, nil
}
