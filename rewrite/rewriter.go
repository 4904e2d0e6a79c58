package rewrite

import (
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/leafproxy/leafproxy/internal/sqlstate"
)

// DefaultCacheSize is the number of entries each cache level keeps when
// Settings.CacheSize or Settings.ShapeCacheSize is 0.
const DefaultCacheSize = 4096

// FillRule makes the proxy fill Column of Table with an ID of Tag on INSERT
// when the statement leaves the column out or gives DEFAULT or NULL for it.
// Names compare exactly with the names PostgreSQL resolves: an unquoted
// ORDERS in SQL is orders, a quoted "Orders" is Orders.
type FillRule struct {
	Schema string // "" matches the table in any schema, qualified or not; otherwise names qualified with Schema, and an unqualified name only Schema holds (see Catalog)
	Table  string
	Column string
	Tag    string
}

// Settings configure a Rewriter. The zero value is valid.
type Settings struct {
	Fill      []FillRule
	CacheSize int // plans kept in the LRU by exact text; 0 means DefaultCacheSize
	// ShapeCacheSize bounds the second cache level, which serves texts that
	// differ from a planned one only in constants (values inlined by the
	// client) without parsing them. 0 means DefaultCacheSize; a negative
	// value turns it off, so that every text missing the first level is
	// parsed.
	ShapeCacheSize int
	// Snowflake is the layout leaf_decode splits IDs by.
	Snowflake SnowflakeLayout
	// Catalog, when set, gives the columns of the filled tables, so that an
	// INSERT without a column list can be filled and a key of type integer
	// or smallint gets IDs with an overflow check. Call Rewriter.CatalogChanged
	// when what it answers changes.
	Catalog Catalog
}

// Catalog gives a filled table's columns as the database's catalog lists
// them. Schema is the INSERT's or COPY's qualifier, or "" for an unqualified
// name, which the session's search_path resolves: a catalog answers for it
// only with columns that hold whichever schema's table the name reaches.
//
// Schemas names the schemas, sorted, that hold a table of the name, filled or
// not (temporary schemas left out), nil when the catalog knows of none. A rule
// that names a schema fills an unqualified name that only its schema holds,
// and an INSERT, COPY or MERGE into an unqualified name that its schema and
// another hold is refused: the proxy cannot tell which one the search_path
// reaches.
//
// A Catalog must be safe for concurrent use.
type Catalog interface {
	Table(schema, table string) (Table, bool)
	Schemas(table string) []string
}

// Table is a table's columns in attnum order, dropped columns left out.
type Table struct {
	Columns []string
	Types   []string // each column's type as format_type prints it, e.g. "bigint", "integer"
}

// maxForType is the largest ID a key column of the given type holds, 0 when
// it holds any int8.
func maxForType(t string) int64 {
	switch t {
	case "integer":
		return math.MaxInt32
	case "smallint":
		return math.MaxInt16
	}
	return 0
}

// Rewriter plans SQL rewrites. It is safe for concurrent use.
type Rewriter struct {
	fill    []fillRule
	needles []string // lower-case table names of the fill rules, for the prefilter
	caches  atomic.Pointer[caches]
	shapeN  int // entries of the shape cache; 0 when turned off
	cacheN  int
	catalog Catalog
	layout  SnowflakeLayout
}

// caches are the two cache levels. CatalogChanged replaces them as one, so a
// plan built from the old catalog can only land in the old caches.
type caches struct {
	text   *lru[cacheEntry]
	shapes *shapeCache // nil when turned off
}

func (r *Rewriter) newCaches() *caches {
	c := &caches{text: newLRU[cacheEntry](r.cacheN)}
	if r.shapeN > 0 {
		c.shapes = newShapeCache(r.shapeN)
	}
	return c
}

// CatalogChanged drops every cached plan: the column lists or key types the
// Catalog gives may have changed, and plans depend on them.
func (r *Rewriter) CatalogChanged() {
	r.caches.Store(r.newCaches())
}

type fillRule struct {
	FillRule
	colSQL string // the column as written into SQL, quoted when needed
	max    int64  // the largest ID the key column holds (from the catalog), 0 for any int8
}

// New validates the settings and returns a Rewriter.
func New(s Settings) (*Rewriter, error) {
	if s.CacheSize < 0 {
		return nil, fmt.Errorf("rewrite: CacheSize %d is negative", s.CacheSize)
	}
	if s.CacheSize == 0 {
		s.CacheSize = DefaultCacheSize
	}
	r := &Rewriter{cacheN: s.CacheSize, catalog: s.Catalog, layout: s.Snowflake.orDefault()}
	if l := r.layout; l.WorkerBits < 0 || l.SequenceBits < 0 || l.WorkerBits+l.SequenceBits > 62 || l.EpochMillis < 0 {
		return nil, fmt.Errorf("rewrite: snowflake layout %+v is invalid", l)
	}
	switch {
	case s.ShapeCacheSize == 0:
		r.shapeN = DefaultCacheSize
	case s.ShapeCacheSize > 0:
		r.shapeN = s.ShapeCacheSize
	}
	r.caches.Store(r.newCaches())
	seen := make(map[[3]string]bool)
	for _, f := range s.Fill {
		if f.Table == "" || f.Column == "" || f.Tag == "" {
			return nil, fmt.Errorf("rewrite: fill rule %+v needs a table, a column and a tag", f)
		}
		if len(f.Schema) > maxIdentLen || len(f.Table) > maxIdentLen || len(f.Column) > maxIdentLen {
			return nil, fmt.Errorf("rewrite: fill rule %s has a name longer than PostgreSQL's %d bytes", ruleName(f), maxIdentLen)
		}
		key := [3]string{f.Schema, f.Table, f.Column}
		if seen[key] {
			return nil, fmt.Errorf("rewrite: fill rule for %s is given twice", ruleName(f))
		}
		seen[key] = true
		r.fill = append(r.fill, fillRule{FillRule: f, colSQL: quoteIdent(f.Column)})
		needle := strings.ToLower(f.Table)
		if !containsString(r.needles, needle) {
			r.needles = append(r.needles, needle)
		}
	}
	return r, nil
}

func ruleName(f FillRule) string {
	if f.Schema == "" {
		return f.Table + "." + f.Column
	}
	return f.Schema + "." + f.Table + "." + f.Column
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Plan returns how to rewrite sql. (nil, nil) means there is nothing to
// rewrite or track: forward the original bytes untouched. That includes text
// pg_query cannot parse, so that PostgreSQL reports its own syntax error. A
// refusal is an *Error carrying the SQLSTATE for the client.
func (r *Rewriter) Plan(sql string) (*Plan, error) {
	if !r.mayNeed(sql) {
		return nil, nil
	}
	c := r.caches.Load()
	if e, ok := c.text.get(sql); ok {
		return e.plan, e.err
	}
	p, shaped, err := r.build(c, sql)
	if !shaped && len(sql) <= maxCachedSQL {
		// A text the shape cache served is not kept: it costs a scan to
		// serve again, and a stream of texts with fresh values would
		// otherwise evict the texts that need a parse (every statement
		// without constants, all refusals).
		c.text.put(sql, cacheEntry{plan: p, err: err})
	}
	return p, err
}

// Cached is Plan when its answer costs no more than the prefilter and a look
// into the text cache; ok is false when sql would have to be scanned or
// parsed, which takes tens of microseconds for a short statement and
// milliseconds for a bulk INSERT. A caller that must not be held up plans
// only what Cached answers and leaves the rest to a goroutine that may wait.
func (r *Rewriter) Cached(sql string) (p *Plan, ok bool, err error) {
	if !r.mayNeed(sql) {
		return nil, true, nil
	}
	if e, hit := r.caches.Load().text.get(sql); hit {
		return e.plan, true, e.err
	}
	return nil, false, nil
}

// Prefiltered reports whether the prefilter alone finds that sql needs nothing
// (cleared), so that Plan returns (nil, nil) for it. The answer depends on the text
// and on the Rewriter's settings only, never on its caches or the catalog: a caller
// may remember it for as long as it uses this Rewriter. noWords: sql has none of the
// prefilter's words at all, not even insert, merge or copy; then it needs nothing
// whatever tables are filled, and so does every text that is the same but for its
// numbers (see SameButNumbers), which a caller may clear by comparing it with sql
// rather than by a scan.
func (r *Rewriter) Prefiltered(sql string) (cleared, noWords bool) {
	need, writes := r.prefilter(sql)
	return !need, !need && !writes
}

// maxCachedSQL bounds the memory of the caches: longer texts (bulk
// multi-row INSERTs, generated SQL) rarely repeat, and 4096 of them could
// otherwise pin gigabytes. They are planned on every use.
const maxCachedSQL = 32 << 10

// mayNeed is the prefilter: a statement without these words cannot call a
// leaf function, insert into a filled table or touch prepared statements.
// One pass over the text looks for all keywords at once. It runs on every
// statement the proxy sees, so it looks closer only at the bytes that can be
// a keyword's anchor, a letter of it that is rare in SQL (the x of execute,
// the f of leaf_), and then compares eight bytes at once.
func (r *Rewriter) mayNeed(sql string) bool {
	need, _ := r.prefilter(sql)
	return need
}

// prefilter is mayNeed (need), and reports whether sql has one of the words of
// writes, insert, merge or copy (writes).
func (r *Rewriter) prefilter(sql string) (need, writes bool) {
	for i := 0; i < len(sql); i++ {
		a := keywordAnchor[sql[i]]
		if a == 0 {
			continue
		}
		start := i - int(anchorOffset[a])
		if start < 0 {
			continue
		}
		var w uint64
		if len(sql)-start >= 8 {
			w = word(sql, start)
		} else {
			w = loadTail(sql, start)
		}
		switch a {
		case 'f':
			if kwLeaf.at(w) {
				return true, writes
			}
		case 'x':
			if kwExecute.at(w) {
				return true, writes
			}
		case 'd':
			if kwDiscard.at(w) || kwDeallocate.at(w) && hasFoldAt(sql, start+8, "te") {
				return true, writes
			}
		case 'i':
			writes = writes || kwInsert.at(w)
		case 'g':
			writes = writes || kwMerge.at(w)
		case 'y':
			writes = writes || kwCopy.at(w)
		}
	}
	if !writes {
		return false, false
	}
	for _, n := range r.needles {
		if containsFold(sql, n) {
			return true, true
		}
	}
	return false, true
}

// keywordAnchor maps a byte to the lower-case anchor letter it is (either
// case) of the prefilter's keywords, 0 for every other byte; anchorOffset is
// where the anchor stands in its keywords.
var keywordAnchor, anchorOffset = func() (t, off [256]byte) {
	for _, k := range []struct {
		anchor byte
		offset byte
	}{
		{'f', 3}, // leaf_
		{'x', 1}, // execute
		{'d', 0}, // deallocate, discard
		{'i', 0}, // insert
		{'g', 3}, // merge
		{'y', 3}, // copy
	} {
		t[k.anchor], t[k.anchor-'a'+'A'] = k.anchor, k.anchor
		off[k.anchor] = k.offset
	}
	return t, off
}()

// foldWord is a keyword's first eight bytes (or fewer) as one little-endian
// word, for comparing it with eight bytes of text at once, ignoring ASCII case.
type foldWord struct {
	fold uint64 // 0x20 in the bytes that are letters: c|0x20 is c's lower case, and only A–Z and a–z map to a–z
	mask uint64 // 0xff in the bytes the keyword has
	want uint64 // the keyword in lower case
}

func newFoldWord(lower string) foldWord {
	var f foldWord
	for i := 0; i < len(lower) && i < 8; i++ {
		c := uint64(lower[i])
		if 'a' <= c && c <= 'z' {
			f.fold |= 0x20 << (8 * i)
		}
		f.mask |= 0xff << (8 * i)
		f.want |= c << (8 * i)
	}
	return f
}

// at reports whether w, eight bytes of text, starts with the keyword.
func (f foldWord) at(w uint64) bool { return (w|f.fold)&f.mask == f.want }

var (
	kwLeaf       = newFoldWord("leaf_")
	kwExecute    = newFoldWord("execute")
	kwDiscard    = newFoldWord("discard")
	kwDeallocate = newFoldWord("deallocate") // its first eight bytes; "te" is checked apart
	kwInsert     = newFoldWord("insert")
	kwMerge      = newFoldWord("merge")
	kwCopy       = newFoldWord("copy")
)

// word returns the eight bytes of s from i as a little-endian word; eight bytes must be
// there.
func word[T string | []byte](s T, i int) uint64 {
	b := s[i : i+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// loadTail returns the last bytes of s from i, fewer than eight, as a
// little-endian word padded with zero bytes (which no keyword has).
func loadTail(s string, i int) uint64 {
	var w uint64
	for j := 0; i+j < len(s); j++ {
		w |= uint64(s[i+j]) << (8 * j)
	}
	return w
}

// hasFoldAt reports whether s[i:] starts with lower, ignoring ASCII case.
func hasFoldAt(s string, i int, lower string) bool {
	return len(s)-i >= len(lower) && equalFoldASCII(s[i:i+len(lower)], lower)
}

// containsFold reports whether s contains needle, comparing ASCII letters
// case-insensitively; needle must be lower case. It does not allocate.
func containsFold(s, needle string) bool {
	n := len(needle)
	if n == 0 {
		return true
	}
	first := needle[0]
	upper := first
	if 'a' <= first && first <= 'z' {
		upper = first - 'a' + 'A'
	}
	for i := 0; i+n <= len(s); i++ {
		if c := s[i]; c != first && c != upper {
			continue
		}
		if equalFoldASCII(s[i+1:i+n], needle[1:]) {
			return true
		}
	}
	return false
}

func equalFoldASCII(s, lower string) bool {
	for i := 0; i < len(lower); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// build plans sql without the text cache: from the shape cache when a text
// of the same shape was planned before (shaped), by parsing otherwise. A
// panic in the planner is a bug; it is turned into an internal error so
// that one odd statement cannot take the proxy down.
func (r *Rewriter) build(c *caches, sql string) (p *Plan, shaped bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			p, shaped, err = nil, false, &Error{Code: sqlstate.InternalError, Message: fmt.Sprintf("rewrite: internal error planning statement: %v", v)}
		}
	}()
	toks, sh := r.scan(c.shapes, sql)
	if sh != nil {
		if t := c.shapes.lookup(sh); t != nil {
			return t.instantiate(sh), true, nil
		}
	}
	res := plan(r, sql, toks)
	if sh != nil {
		c.shapes.learn(sh, res)
	}
	return res.plan, false, res.err
}

// scan returns the tokens of sql without comments (none when the scanner
// rejects the text, which then does not parse either) and, when the shape
// cache may serve or learn it, its shape.
func (r *Rewriter) scan(shapes *shapeCache, sql string) (tokens, *shape) {
	if strings.IndexByte(sql, 0) >= 0 {
		return tokens{}, nil // plan forwards it untouched
	}
	all, err := scan(sql)
	if err != nil {
		return tokens{}, nil
	}
	toks := withoutComments(all)
	if shapes == nil || len(sql) > maxCachedSQL || !utf8.ValidString(sql) {
		// pg_query refuses a tree holding invalid UTF-8, so whether a text
		// parses would depend on the bytes inside its constants.
		return toks, nil
	}
	sh := shapeOf(sql, toks)
	if sh == nil || len(sh.consts) == 0 {
		// Without constants the shape is the text: the text cache holds it.
		return toks, nil
	}
	return toks, sh
}

// quoteIdent writes an identifier so that PostgreSQL reads it back as name.
func quoteIdent(name string) string {
	if isPlainIdent(name) {
		return name
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// isPlainIdent reports whether name can be written unquoted: lower-case
// letters, digits and underscores, not starting with a digit, and not a
// keyword (any keyword, to stay safe in every position).
func isPlainIdent(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return !isKeyword(name)
}
