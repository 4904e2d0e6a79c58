package proxy

import (
	"encoding/binary"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"
)

// The server messages the proxy writes itself. On the hot path (the fast path, local
// cycles) a message is appended to a buffer by one of these functions, without
// allocating; errors, which are rare, are encoded with pgproto3 (errorResponse, fatal).

// encodeError encodes an ErrorResponse, with the unlocalized severity (field V) the same
// as the severity.
func encodeError(msg *pgproto3.ErrorResponse) []byte {
	msg.SeverityUnlocalized = msg.Severity
	b, _ := msg.Encode(nil) // cannot fail: no field has a length limit
	return b
}

// appendEmpty appends a message that has no body: ParseComplete, BindComplete,
// CloseComplete, PortalSuspended or NoData.
func appendEmpty(b []byte, typ byte) []byte { return append(b, typ, 0, 0, 0, 4) }

// beginMessage appends a message's type and room for its length, which endMessage fills
// in once the body is appended; at is where the length goes.
func beginMessage(b []byte, typ byte) (_ []byte, at int) {
	b = append(b, typ)
	return append(b, 0, 0, 0, 0), len(b)
}

// endMessage fills in the length of the message begun at at.
func endMessage(b []byte, at int) []byte {
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at))
	return b
}

// appendParameterDescription appends a ParameterDescription of the given types.
func appendParameterDescription(b []byte, types []uint32) []byte {
	b, at := beginMessage(b, serverParameterDescription)
	b = binary.BigEndian.AppendUint16(b, uint16(len(types)))
	for _, t := range types {
		b = binary.BigEndian.AppendUint32(b, t)
	}
	return endMessage(b, at)
}

// appendRowDescription appends the RowDescription PostgreSQL sends for the rewritten
// fast-path statement: one int8 column.
func appendRowDescription(b []byte, column string, binaryFormat bool) []byte {
	b, at := beginMessage(b, serverRowDescription)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = appendField(b, column, oidInt8, binaryFormat)
	return endMessage(b, at)
}

// appendField appends the description of a result column of an 8-byte type (int8,
// timestamptz) that belongs to no table.
func appendField(b []byte, name string, oid uint32, binaryFormat bool) []byte {
	b = append(b, name...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0) // table OID
	b = binary.BigEndian.AppendUint16(b, 0) // column number
	b = binary.BigEndian.AppendUint32(b, oid)
	b = binary.BigEndian.AppendUint16(b, 8)          // typlen
	b = binary.BigEndian.AppendUint32(b, 0xffffffff) // typmod -1
	format := uint16(0)
	if binaryFormat {
		format = 1
	}
	return binary.BigEndian.AppendUint16(b, format)
}

// appendDataRow appends a DataRow of one int8 value.
func appendDataRow(b []byte, id int64, binaryFormat bool) []byte {
	b, at := beginMessage(b, serverDataRow)
	b = binary.BigEndian.AppendUint16(b, 1)
	b = appendInt8Value(b, id, binaryFormat)
	return endMessage(b, at)
}

// appendInt8Value appends an int8 column value of a DataRow, with its length: decimal
// text, or 8 bytes big-endian in binary format.
func appendInt8Value(b []byte, v int64, binaryFormat bool) []byte {
	if binaryFormat {
		b = binary.BigEndian.AppendUint32(b, 8)
		return binary.BigEndian.AppendUint64(b, uint64(v))
	}
	var digits [20]byte
	value := strconv.AppendInt(digits[:0], v, 10)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// appendCommandComplete appends a CommandComplete with the given tag.
func appendCommandComplete(b []byte, tag string) []byte {
	b, at := beginMessage(b, serverCommandComplete)
	b = append(b, tag...)
	b = append(b, 0)
	return endMessage(b, at)
}
