package rewrite

import (
	"reflect"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// The parse tree has a few hundred node types. The planner handles the
// statements where an ID can go explicitly and walks everything else
// generically, so that no node type (and no leaf_next call hidden inside
// one) can be missed.
//
// The walk reads the Go structs protoc-gen-go generates through package
// reflect rather than through protoreflect: it needs only the
// message-valued fields (see nodeType), and reflect reads a pointer or a
// slice without the allocations of protoreflect's Get. A test compares it
// with a walk through protoreflect over every node type.

// unwrap returns the concrete message inside a Node, or m itself.
func unwrap(m proto.Message) proto.Message {
	n, ok := m.(*pg_query.Node)
	if !ok {
		return m
	}
	if n == nil || n.Node == nil {
		return nil
	}
	// Every oneof wrapper (*pg_query.Node_InsertStmt, …) is a struct
	// holding the one message.
	return reflect.ValueOf(n.Node).Elem().Field(0).Interface().(proto.Message)
}

// walk calls visit for every message below m (not m itself), Node wrappers
// unwrapped, in field order. visit returns whether to descend into the
// message. Fields named in skip are not visited at m's level.
func walk(m proto.Message, visit func(proto.Message) bool, skip ...string) {
	v := reflect.ValueOf(m)
	if m == nil || v.IsNil() {
		return
	}
	v = v.Elem()
	for _, f := range nodeTypeOf(v.Type()).children {
		if skipped(f.name, skip) {
			continue
		}
		fv := v.Field(f.index)
		switch {
		case f.list:
			for j := 0; j < fv.Len(); j++ {
				visitChild(fv.Index(j).Interface().(proto.Message), visit)
			}
		case f.oneof:
			if !fv.IsNil() {
				visitChild(fv.Elem().Elem().Field(0).Interface().(proto.Message), visit)
			}
		case !fv.IsNil():
			visitChild(fv.Interface().(proto.Message), visit)
		}
	}
}

// isNil reports whether m is nil or a nil pointer.
func isNil(m proto.Message) bool {
	return m == nil || reflect.ValueOf(m).IsNil()
}

func skipped(name string, skip []string) bool {
	for _, s := range skip {
		if s == name {
			return true
		}
	}
	return false
}

func visitChild(m proto.Message, visit func(proto.Message) bool) {
	m = unwrap(m)
	if m == nil {
		return
	}
	if visit(m) {
		walk(m, visit)
	}
}

// minLocation returns the smallest location field in the messages below
// and including nodes, or -1. The nodes are in textual order (the rows of
// a VALUES list), and a node's locations lie in its own text, so the first
// node with any location has the smallest: a bulk INSERT's other rows are
// not walked.
func minLocation(nodes []*pg_query.Node) int {
	min := -1
	note := func(m proto.Message) {
		v := reflect.ValueOf(m).Elem()
		if i := nodeTypeOf(v.Type()).location; i >= 0 {
			if loc := int(v.Field(i).Int()); loc >= 0 && (min < 0 || loc < min) {
				min = loc
			}
		}
	}
	for _, n := range nodes {
		m := unwrap(n)
		if m == nil {
			continue
		}
		note(m)
		walk(m, func(c proto.Message) bool { note(c); return true })
		if min >= 0 {
			break
		}
	}
	return min
}

// leafFunc returns "leaf_next" or "leaf_snowflake" when fc calls one of the
// proxy's functions: an unqualified name, as the parser resolved it.
func leafFunc(fc *pg_query.FuncCall) string {
	if len(fc.Funcname) != 1 {
		return ""
	}
	switch name := fc.Funcname[0].GetString_().GetSval(); name {
	case "leaf_next", "leaf_snowflake":
		return name
	}
	return ""
}

// figureColname mirrors PostgreSQL's FigureColnameInternal for the node
// types through which a leaf_* call can name a result column. With
// leafConst, leaf_* calls count as the constants they become. It returns
// the name and PostgreSQL's strength (0: "?column?", 1: weak, 2: strong).
func figureColname(m proto.Message, leafConst bool) (string, int) {
	switch n := unwrap(m).(type) {
	case *pg_query.ColumnRef:
		for i := len(n.Fields) - 1; i >= 0; i-- {
			if s := n.Fields[i].GetString_(); s != nil {
				return s.Sval, 2
			}
		}
	case *pg_query.A_Indirection:
		for i := len(n.Indirection) - 1; i >= 0; i-- {
			if s := n.Indirection[i].GetString_(); s != nil {
				return s.Sval, 2
			}
		}
		return figureColname(n.Arg, leafConst)
	case *pg_query.FuncCall:
		if leafConst && leafFunc(n) != "" {
			return "", 0
		}
		if len(n.Funcname) > 0 {
			return n.Funcname[len(n.Funcname)-1].GetString_().GetSval(), 2
		}
	case *pg_query.A_Expr:
		if n.Kind == pg_query.A_Expr_Kind_AEXPR_NULLIF {
			return "nullif", 2
		}
	case *pg_query.TypeCast:
		name, strength := figureColname(n.Arg, leafConst)
		if strength <= 1 && n.TypeName != nil && len(n.TypeName.Names) > 0 {
			return n.TypeName.Names[len(n.TypeName.Names)-1].GetString_().GetSval(), 1
		}
		return name, strength
	case *pg_query.CollateClause:
		return figureColname(n.Arg, leafConst)
	case *pg_query.CaseExpr:
		name, strength := figureColname(n.Defresult, leafConst)
		if strength <= 1 {
			return "case", 1
		}
		return name, strength
	case *pg_query.A_ArrayExpr:
		return "array", 2
	case *pg_query.RowExpr:
		return "row", 2
	case *pg_query.CoalesceExpr:
		return "coalesce", 2
	case *pg_query.MinMaxExpr:
		if n.Op == pg_query.MinMaxOp_IS_GREATEST {
			return "greatest", 2
		}
		return "least", 2
	case *pg_query.GroupingFunc:
		return "grouping", 2
	}
	return "", 0
}

// setReturning lists built-in set-returning functions. Next to one of them a
// target list yields several rows, and PostgreSQL would evaluate leaf_next
// once per row; user-defined ones cannot be known without the catalog.
var setReturning = map[string]bool{
	"generate_series": true, "generate_subscripts": true, "unnest": true,
	"regexp_matches": true, "regexp_split_to_table": true, "string_to_table": true,
	"json_array_elements": true, "json_array_elements_text": true,
	"jsonb_array_elements": true, "jsonb_array_elements_text": true,
	"json_each": true, "json_each_text": true, "jsonb_each": true, "jsonb_each_text": true,
	"json_object_keys": true, "jsonb_object_keys": true,
	"json_populate_recordset": true, "jsonb_populate_recordset": true,
	"json_to_recordset": true, "jsonb_to_recordset": true,
	"jsonb_path_query": true, "jsonb_path_query_tz": true,
	"pg_ls_dir": true, "pg_listening_channels": true, "pg_options_to_table": true,
	"pg_get_keywords": true, "pg_tablespace_databases": true, "txid_snapshot_xip": true,
	"pg_snapshot_xip": true, "ts_stat": true, "ts_debug": true, "ts_parse": true,
	"ts_token_type": true, "pg_get_catalog_foreign_keys": true,
}

// constLocations returns the locations of the A_Const nodes of tree.
func constLocations(tree *pg_query.ParseResult) []int32 {
	var locs []int32
	for _, raw := range tree.Stmts {
		visitChild(raw.Stmt, func(m proto.Message) bool {
			c, ok := m.(*pg_query.A_Const)
			if ok {
				locs = append(locs, c.Location)
			}
			return !ok
		})
	}
	return locs
}
