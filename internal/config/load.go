package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Flags are the configuration flags registered on one FlagSet. Parse the FlagSet, then
// call Load.
type Flags struct {
	configFile string
	values     []*flagValue
}

// RegisterFlags adds --config and one flag per setting to fs. The help of each flag names
// its environment variable and default.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.configFile, "config", "", "read settings from this YAML `FILE` (env "+EnvName("config")+")")
	def := Defaults()
	for i := range settings {
		s := &settings[i]
		v := &flagValue{s: s, def: render(s.field(&def))}
		f.values = append(f.values, v)
		fs.Var(v, s.name, s.usage+" (env "+EnvName(s.name)+")")
		if s.alias != "" {
			fs.Var(v, s.alias, "same as --"+s.name)
		}
	}
	return f
}

// flagValue records the raw values of one flag; Load applies them after the file and the
// environment so that flags win.
type flagValue struct {
	s    *setting
	def  string
	vals []string
}

func (v *flagValue) String() string {
	if v == nil {
		return ""
	}
	return v.def
}

func (v *flagValue) Set(s string) error {
	if v.s.repeat || len(v.vals) == 0 {
		v.vals = append(v.vals, s)
	} else {
		v.vals[0] = s
	}
	// Parse now so that a bad flag fails flag parsing with the flag's name.
	var scratch Config
	return setString(v.s.field(&scratch), s)
}

// IsBoolFlag lets boolean settings be given as --migrate-on-start without a value.
func (v *flagValue) IsBoolFlag() bool {
	var scratch Config
	_, ok := v.s.field(&scratch).(*bool)
	return ok
}

// FlagArg returns the placeholder a help text shows after the flag of a setting
// ("--listen host:port"); "" for booleans and for names that are not settings.
func FlagArg(name string) string {
	s, ok := lookup(name)
	if !ok {
		return ""
	}
	if s.arg != "" {
		return s.arg
	}
	var scratch Config
	switch s.field(&scratch).(type) {
	case *int, *int64:
		return "N"
	case *float64:
		return "FRACTION"
	case *time.Duration:
		return "DURATION"
	case *List:
		return "LIST"
	case *string:
		return "STRING"
	}
	return ""
}

func render(p any) string {
	switch p := p.(type) {
	case *string:
		return *p
	case *int:
		return strconv.Itoa(*p)
	case *int64:
		return strconv.FormatInt(*p, 10)
	case *bool:
		return strconv.FormatBool(*p)
	case *float64:
		return strconv.FormatFloat(*p, 'g', -1, 64)
	case *time.Duration:
		return p.String()
	case *List:
		return strings.Join(*p, ",")
	case entryList:
		return p.String()
	}
	panic(fmt.Sprintf("config: unsupported field type %T", p))
}

// setString parses s into the field p points to.
func setString(p any, s string) error {
	switch p := p.(type) {
	case *string:
		*p = s
	case *int:
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		*p = n
	case *int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not an integer", s)
		}
		*p = n
	case *bool:
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a boolean (true or false)", s)
		}
		*p = b
	case *float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", s)
		}
		*p = f
	case *time.Duration:
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("%q is not a duration such as 500ms or 30s", s)
		}
		*p = d
	case *List:
		*p = splitList(s)
	case entryList:
		return p.Set(s)
	default:
		panic(fmt.Sprintf("config: unsupported field type %T", p))
	}
	return nil
}

// entryList is a setting of named entries (databases, users): repeated flags each add
// entries, the environment gives them all separated by ';'.
type entryList interface {
	Set(string) error
	String() string
	setFlags([]string) error
}

// LookupEnv is how Load reads the environment; os.LookupEnv in production.
type LookupEnv func(string) (string, bool)

// Load builds the configuration: defaults, then the file (--config or LEAFPROXY_CONFIG),
// then the environment, then the flags parsed into f; then it validates the result.
func Load(f *Flags, env LookupEnv) (*Config, error) {
	if env == nil {
		env = os.LookupEnv
	}
	c := Defaults()
	c.Origins = make(map[string]string, len(settings))
	for _, s := range settings {
		c.Origins[s.name] = "default"
	}
	path := f.configFile
	if path == "" {
		path, _ = env(EnvName("config"))
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		if err := c.applyYAML(path, data); err != nil {
			return nil, err
		}
	}
	for _, s := range settings {
		name := EnvName(s.name)
		raw, ok := env(name)
		if !ok {
			continue
		}
		if err := setString(s.field(&c), raw); err != nil {
			return nil, fmt.Errorf("%s (env %s): %w", s.name, name, err)
		}
		c.Origins[s.name] = "env " + name
	}
	for _, v := range f.values {
		if len(v.vals) == 0 {
			continue
		}
		p := v.s.field(&c)
		if l, ok := p.(*List); ok {
			// A repeated flag adds up; its first use replaces what file or env said.
			*l = nil
			for _, raw := range v.vals {
				*l = append(*l, splitList(raw)...)
			}
		} else if d, ok := p.(entryList); ok {
			if err := d.setFlags(v.vals); err != nil {
				return nil, fmt.Errorf("%s (flag --%s): %w", v.s.name, v.s.alias, err)
			}
		} else if err := setString(p, v.vals[0]); err != nil {
			return nil, fmt.Errorf("%s (flag --%s): %w", v.s.name, v.s.name, err)
		}
		c.Origins[v.s.name] = "flag --" + v.s.name
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// ReadFile returns the defaults overlaid with a configuration file, without looking at the
// environment and without validating: for commands that need a few settings of a file
// written for serve (decode reads snowflake-epoch).
func ReadFile(path string) (Config, error) {
	c := Defaults()
	c.Origins = map[string]string{}
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("config file: %w", err)
	}
	return c, c.applyYAML(path, data)
}

// applyYAML reads a configuration file. Each key is decoded on its own so that an error
// names the key and its line.
func (c *Config) applyYAML(path string, data []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil // an empty file (or only comments) configures nothing
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s:%d: want a mapping of setting names to values", path, root.Line)
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		at := fmt.Sprintf("%s:%d", path, k.Line)
		s, ok := lookup(k.Value)
		if !ok {
			msg := fmt.Sprintf("config file %s: unknown key %q", at, k.Value)
			if near := nearest(k.Value); near != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", near)
			}
			return errors.New(msg)
		}
		if line, dup := seen[k.Value]; dup {
			return fmt.Errorf("config file %s: key %q given twice (first on line %d)", at, k.Value, line)
		}
		seen[k.Value] = k.Line
		if err := v.Decode(s.field(c)); err != nil {
			return fmt.Errorf("config file %s: %s: %s", at, k.Value, yamlMessage(err))
		}
		c.Origins[s.name] = "file " + at
	}
	// The per-key pass above gives the better messages; decoding the whole document with
	// KnownFields as well keeps the struct tags and the settings table honest.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	check := Defaults()
	if err := dec.Decode(&check); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// yamlMessage strips the "yaml: unmarshal errors:\n  line N: " wrapping; the caller
// already says which key and line.
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg := te.Errors[0]
		if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
			msg = msg[i+2:]
		}
		return msg
	}
	return err.Error()
}

// nearest suggests the known name closest to an unknown one, if any is close.
func nearest(name string) string { return Nearest(name, Names()) }

// Nearest returns the candidate an unknown name most likely meant: the closest one within
// one edit per three letters (at least one, at most three; case and '_' for '-' do not
// count), else the shortest one it begins, else "".
func Nearest(name string, candidates []string) string {
	name = strings.ToLower(strings.ReplaceAll(name, "_", "-"))
	sorted := append([]string(nil), candidates...)
	sort.Strings(sorted)
	best, bestD := "", max(1, min(3, len(name)/3))+1
	for _, n := range sorted {
		if d := distance(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best != "" || name == "" {
		return best
	}
	for _, n := range sorted {
		if strings.HasPrefix(n, name) && (best == "" || len(n) < len(best)) {
			best = n
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
