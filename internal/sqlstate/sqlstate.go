// Package sqlstate is the one catalogue of the SQLSTATE codes leafproxy reports or
// recognises. Each constant is named after PostgreSQL's condition name (Appendix A of the
// PostgreSQL manual), which the comment repeats, followed by what leafproxy uses it for.
//
// A code the proxy answers a client with is also documented in the README's SQLSTATE
// table; add it there when adding it here.
package sqlstate

// Class 08: connection exception.
const (
	// ConnectionUnable is sqlclient_unable_to_establish_sqlconnection: the proxy cannot
	// reach or log in to the upstream server.
	ConnectionUnable = "08001"
	// ConnectionFailure is connection_failure: the upstream connection broke.
	ConnectionFailure = "08006"
	// ProtocolViolation is protocol_violation: a message the protocol does not allow.
	ProtocolViolation = "08P01"
)

// Class 0A: feature not supported.
const (
	// FeatureNotSupported is feature_not_supported: a call, statement or request the proxy
	// cannot serve safely.
	FeatureNotSupported = "0A000"
)

// Class 22: data exception.
const (
	// NumericValueOutOfRange is numeric_value_out_of_range: an ID too large for its key
	// column.
	NumericValueOutOfRange = "22003"
	// InvalidParameterValue is invalid_parameter_value: a bad leaf_next argument.
	InvalidParameterValue = "22023"
	// BadCopyFileFormat is bad_copy_file_format: COPY data the proxy cannot read.
	BadCopyFileFormat = "22P04"
)

// Class 25: invalid transaction state.
const (
	// InFailedSQLTransaction is in_failed_sql_transaction: the server's answer to a
	// statement inside a failed transaction block.
	InFailedSQLTransaction = "25P02"
)

// Class 26: invalid SQL statement name.
const (
	// InvalidSQLStatementName is invalid_sql_statement_name: no prepared statement of
	// that name.
	InvalidSQLStatementName = "26000"
)

// Class 28: invalid authorization specification.
const (
	// InvalidAuthorizationSpecification is invalid_authorization_specification.
	InvalidAuthorizationSpecification = "28000"
	// InvalidPassword is invalid_password.
	InvalidPassword = "28P01"
)

// Class 3D: invalid catalog name.
const (
	// InvalidCatalogName is invalid_catalog_name: a client asked for a database the proxy
	// has no route to.
	InvalidCatalogName = "3D000"
)

// Class 42: syntax error or access rule violation.
const (
	// UndefinedColumn is undefined_column: the error a refused statement's stand-in fails
	// with on the server.
	UndefinedColumn = "42703"
	// UndefinedObject is undefined_object: an unknown ID tag.
	UndefinedObject = "42704"
	// DuplicatePreparedStatement is duplicate_prepared_statement: in transaction pool mode,
	// a client's Parse of a statement name it already has, answered by the proxy as the
	// server would.
	DuplicatePreparedStatement = "42P05"
	// UndefinedTable is undefined_table: the Leaf schema is not migrated yet.
	UndefinedTable = "42P01"
	// UndefinedParameter is undefined_parameter: a $n the statement has no value for.
	UndefinedParameter = "42P02"
)

// Class 53: insufficient resources.
const (
	// TooManyConnections is too_many_connections: the proxy's client limit is reached.
	TooManyConnections = "53300"
)

// Class 54: program limit exceeded.
const (
	// ProgramLimitExceeded is program_limit_exceeded: a message larger than the limit.
	ProgramLimitExceeded = "54000"
	// StatementTooComplex is statement_too_complex: a statement nested too deeply to parse
	// safely.
	StatementTooComplex = "54001"
)

// Class 55: object not in prerequisite state.
const (
	// ObjectNotInPrerequisiteState is object_not_in_prerequisite_state: the clock moved
	// backwards, or the proxy does not hold its snowflake worker ID now.
	ObjectNotInPrerequisiteState = "55000"
)

// Class 57: operator intervention.
const (
	// QueryCanceled is query_canceled: a statement cancelled by the client (and the
	// server's answer to a CopyFail).
	QueryCanceled = "57014"
	// AdminShutdown is admin_shutdown: the proxy is shutting down.
	AdminShutdown = "57P01"
	// CannotConnectNow is cannot_connect_now: the proxy refuses new clients while it
	// shuts down.
	CannotConnectNow = "57P03"
)

// Class 58: system error (errors external to PostgreSQL itself).
const (
	// SystemError is system_error: the ID source cannot issue now, or failed without a
	// SQLSTATE of its own.
	SystemError = "58000"
)

// Class XX: internal error.
const (
	// InternalError is internal_error: a bug, never expected.
	InternalError = "XX000"
)
