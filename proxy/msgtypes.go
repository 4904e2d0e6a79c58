package proxy

// Message types of the PostgreSQL wire protocol (version 3), the byte that starts every
// message after startup. Client and server messages are named apart because their bytes
// overlap: 'D' is Describe from the client and DataRow from the server, 'E' Execute and
// ErrorResponse, 'S' Sync and ParameterStatus, 'C' Close and CommandComplete.

// Messages a client sends (frontend messages).
const (
	clientBind         = 'B'
	clientClose        = 'C'
	clientCopyData     = 'd'
	clientCopyDone     = 'c'
	clientCopyFail     = 'f'
	clientDescribe     = 'D'
	clientExecute      = 'E'
	clientFlush        = 'H'
	clientFunctionCall = 'F'
	clientParse        = 'P'
	clientPassword     = 'p' // also SASLInitialResponse and SASLResponse
	clientQuery        = 'Q'
	clientSync         = 'S'
	clientTerminate    = 'X'
)

// Messages a server sends (backend messages).
const (
	serverAuthentication       = 'R' // every Authentication* message
	serverBackendKeyData       = 'K'
	serverBindComplete         = '2'
	serverCloseComplete        = '3'
	serverCommandComplete      = 'C'
	serverCopyData             = 'd'
	serverCopyDone             = 'c'
	serverCopyInResponse       = 'G'
	serverDataRow              = 'D'
	serverEmptyQueryResponse   = 'I'
	serverErrorResponse        = 'E'
	serverNoData               = 'n'
	serverNoticeResponse       = 'N'
	serverNotification         = 'A' // NotificationResponse
	serverParameterDescription = 't'
	serverParameterStatus      = 'S'
	serverParseComplete        = '1'
	serverPortalSuspended      = 's'
	serverReadyForQuery        = 'Z'
	serverRowDescription       = 'T'
)

// Transaction statuses a ReadyForQuery reports.
const (
	txIdle    = 'I' // not in a transaction block
	txInBlock = 'T' // in a transaction block
	txFailed  = 'E' // in a failed transaction block: statements are refused until its end
)

// What a Describe or Close names, the first byte of its body.
const (
	targetStatement = 'S' // a prepared statement
	targetPortal    = 'P' // a portal
)

// The one-byte answers to an SSLRequest, sent before any message.
const (
	sslAccepted = 'S'
	sslRefused  = 'N'
)

// Fields of an ErrorResponse or NoticeResponse the proxy reads or writes.
const (
	fieldSeverity            = 'S' // localized severity
	fieldSeverityUnlocalized = 'V' // severity, never localized
	fieldCode                = 'C' // SQLSTATE
	fieldMessage             = 'M'
)
