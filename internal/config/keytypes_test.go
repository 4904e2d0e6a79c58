package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/leafproxy/leafproxy/internal/metrics"
)

func TestKeyTypes(t *testing.T) {
	env := map[string]string{"LEAFPROXY_STORE": testStore}
	c, err := load(t, "key-types: [order=integer, '*=js']\n", env)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]metrics.KeyType{"order": metrics.KeyInteger, AnyTag: metrics.KeyJS}
	if !reflect.DeepEqual(c.TagKeyTypes, want) {
		t.Errorf("key types = %v, want %v", c.TagKeyTypes, want)
	}
	c, err = load(t, "", env)
	if err != nil || len(c.TagKeyTypes) != 0 {
		t.Errorf("default key types = %v, %v; want none (every tag bigint)", c.TagKeyTypes, err)
	}
	for _, tc := range []struct{ flag, want string }{
		{"order=smallint", `key type "smallint" is not one of bigint, integer, js`},
		{"order", `"order" is not TAG=TYPE`},
		{"order=integer,order=bigint", `tag "order" has two key types`},
		{"=integer", `is not TAG=TYPE`},
	} {
		_, err := load(t, "", env, "--key-types", tc.flag)
		if err == nil || !strings.Contains(err.Error(), "key-types (flag --key-types)") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--key-types %s: error %v, want %q", tc.flag, err, tc.want)
		}
	}
}
