package rewrite

import (
	"reflect"
	"strings"

	pg_query "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// nodeType is what walk and decodeTree need to know of a message struct
// that protoc-gen-go generated for pg_query's parse tree. The fields of the
// descriptor are matched with those of the struct by the names in the
// struct tags; oneof members live in an interface field, wrapped in a
// struct whose one field is the member.
type nodeType struct {
	children []childField          // message-valued fields, in field order
	location int                   // the Go field of the int32 location field, or -1
	aConst   bool                  // the type is A_Const, whose locations decodeTree collects
	fields   map[string]*jsonField // every field by JSON name
	order    []*jsonField          // every field in descriptor order, which is the order libpg_query writes them in
}

// childField is a message-valued field for walk: a pointer, a slice of
// pointers, or a oneof of messages.
type childField struct {
	name  string // the proto field's name, or the oneof's
	index int    // the Go struct field
	list  bool
	oneof bool
}

// jsonField is a field for decodeTree.
type jsonField struct {
	index   int // the Go struct field: for a oneof member, the oneof's interface
	kind    protoreflect.Kind
	list    bool
	json    string           // the JSON name
	order   int              // the field's index in nodeType.order
	message reflect.Type     // the struct type of a message field
	node    *nodeType        // and its nodeType
	wrapper reflect.Type     // the struct type wrapping a oneof member
	enum    map[string]int32 // the numbers of an enum's values by name
}

// nodeTypes holds the nodeType of every message type of pg_query's parse
// tree; it is not written after initialisation.
var nodeTypes = func() map[reflect.Type]*nodeType {
	msgs := (&pg_query.Node{}).ProtoReflect().Descriptor().ParentFile().Messages()
	types := make(map[reflect.Type]*nodeType, msgs.Len())
	for i := 0; i < msgs.Len(); i++ {
		md := msgs.Get(i)
		t := goStruct(md)
		types[t] = newNodeType(t, md)
	}
	for _, nt := range types {
		for _, f := range nt.order {
			if f.message != nil {
				f.node = types[f.message]
			}
		}
	}
	return types
}()

// nodeTypeOf returns the nodeType of the generated message struct t.
func nodeTypeOf(t reflect.Type) *nodeType {
	if nt, ok := nodeTypes[t]; ok {
		return nt
	}
	// Not a parse tree type: find its fields the slow way.
	return newNodeType(t, reflect.New(t).Interface().(proto.Message).ProtoReflect().Descriptor())
}

// goStruct returns the generated struct type of md.
func goStruct(md protoreflect.MessageDescriptor) reflect.Type {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.FullName())
	if err != nil {
		panic(err) // pg_query registers every message type of its file
	}
	return reflect.TypeOf(mt.Zero().Interface()).Elem()
}

func newNodeType(t reflect.Type, md protoreflect.MessageDescriptor) *nodeType {
	nt := &nodeType{location: -1, aConst: t == reflect.TypeFor[pg_query.A_Const](), fields: make(map[string]*jsonField)}
	byName := make(map[string]int) // proto field or oneof name → Go struct field
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if name, ok := sf.Tag.Lookup("protobuf_oneof"); ok {
			byName[name] = i
		} else if name := tagName(sf.Tag.Get("protobuf")); name != "" {
			byName[name] = i
		}
	}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if fd.IsMap() {
			continue // decodeTree refuses the field and falls back; walk skips it
		}
		od := fd.ContainingOneof()
		name := string(fd.Name())
		if od != nil {
			name = string(od.Name())
			if fd.Kind() != od.Fields().Get(0).Kind() {
				// walk takes a oneof's member for a message.
				panic("rewrite: oneof " + string(od.FullName()) + " mixes messages and scalars")
			}
		}
		index, ok := byName[name]
		if !ok {
			panic("rewrite: no Go field for " + string(fd.FullName()))
		}
		f := &jsonField{index: index, kind: fd.Kind(), list: fd.IsList(), json: fd.JSONName()}
		switch fd.Kind() {
		case protoreflect.MessageKind:
			f.message = goStruct(fd.Message())
			switch {
			case od == nil:
				nt.children = append(nt.children, childField{name: name, index: index, list: fd.IsList()})
			case od.Fields().Get(0) == fd:
				nt.children = append(nt.children, childField{name: name, index: index, oneof: true})
			}
			if od != nil {
				f.wrapper = oneofWrapper(md, fd, index)
			}
		case protoreflect.EnumKind:
			values := fd.Enum().Values()
			f.enum = make(map[string]int32, values.Len())
			for j := 0; j < values.Len(); j++ {
				f.enum[string(values.Get(j).Name())] = int32(values.Get(j).Number())
			}
		case protoreflect.Int32Kind:
			if name == "location" && !fd.IsList() {
				nt.location = index
			}
		}
		f.order = len(nt.order)
		nt.fields[fd.JSONName()] = f
		nt.order = append(nt.order, f)
	}
	return nt
}

// tagName returns the name= entry of a protobuf struct tag.
func tagName(tag string) string {
	for _, part := range strings.Split(tag, ",") {
		if name, ok := strings.CutPrefix(part, "name="); ok {
			return name
		}
	}
	return ""
}

// oneofWrapper returns the struct type that holds the oneof member fd of
// md in the interface field index: the type protobuf itself stores there.
func oneofWrapper(md protoreflect.MessageDescriptor, fd protoreflect.FieldDescriptor, index int) reflect.Type {
	m := reflect.New(goStruct(md)).Interface().(proto.Message).ProtoReflect()
	m.Set(fd, protoreflect.ValueOfMessage(m.NewField(fd).Message()))
	return reflect.ValueOf(m.Interface()).Elem().Field(index).Elem().Type().Elem()
}
