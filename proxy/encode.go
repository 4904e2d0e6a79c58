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

// appendParameterDescription appends a ParameterDescription of the given types.
func appendParameterDescription(b []byte, types []uint32) []byte {
	b = append(b, serverParameterDescription)
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+4*len(types)))
	b = binary.BigEndian.AppendUint16(b, uint16(len(types)))
	for _, t := range types {
		b = binary.BigEndian.AppendUint32(b, t)
	}
	return b
}

// appendRowDescription appends the RowDescription PostgreSQL sends for the rewritten
// fast-path statement: one int8 column.
func appendRowDescription(b []byte, column string, binaryFormat bool) []byte {
	b = append(b, serverRowDescription)
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+len(column)+1+18))
	b = binary.BigEndian.AppendUint16(b, 1)
	b = append(b, column...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, 0) // table OID
	b = binary.BigEndian.AppendUint16(b, 0) // column number
	b = binary.BigEndian.AppendUint32(b, oidInt8)
	b = binary.BigEndian.AppendUint16(b, 8)          // typlen
	b = binary.BigEndian.AppendUint32(b, 0xffffffff) // typmod -1
	format := uint16(0)
	if binaryFormat {
		format = 1
	}
	return binary.BigEndian.AppendUint16(b, format)
}

func appendDataRow(b []byte, id int64, binaryFormat bool) []byte {
	var digits [20]byte
	value := strconv.AppendInt(digits[:0], id, 10)
	if binaryFormat {
		value = binary.BigEndian.AppendUint64(digits[:0], uint64(id))
	}
	b = append(b, serverDataRow)
	b = binary.BigEndian.AppendUint32(b, uint32(4+2+4+len(value)))
	b = binary.BigEndian.AppendUint16(b, 1)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func appendCommandComplete(b []byte, tag string) []byte {
	b = append(b, serverCommandComplete)
	b = binary.BigEndian.AppendUint32(b, uint32(4+len(tag)+1))
	b = append(b, tag...)
	return append(b, 0)
}
