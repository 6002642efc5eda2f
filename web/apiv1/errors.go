package apiv1

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error codes: the "code" of an error response. Clients branch on these,
// never on the message.
const (
	// CodeInvalidJSON (400): the body is not one JSON value in UTF-8.
	CodeInvalidJSON = "invalid_json"
	// CodeInvalidField (400): a field of the body has the wrong type or
	// value; "field" is its path (tasks[3].params.user).
	CodeInvalidField = "invalid_field"
	// CodeMissingField (400): a required field of the body is missing.
	CodeMissingField = "missing_field"
	// CodeUnknownField (400): the body has a field the route does not take.
	CodeUnknownField = "unknown_field"
	// CodeTooDeep (400): the body nests arrays and objects too deeply.
	CodeTooDeep = "too_deep"
	// CodeInvalidParameter (400): a query or path parameter has the wrong
	// value; "field" is its name.
	CodeInvalidParameter = "invalid_parameter"
	// CodeUnknownParameter (400): the query has a parameter the route does
	// not take.
	CodeUnknownParameter = "unknown_parameter"
	// CodeUnauthorized (401) and CodeForbidden (403): see Deny.
	CodeUnauthorized = "unauthorized"
	CodeForbidden    = "forbidden"
	// CodeNotFound (404): no such route, queue, task or node ("field" says
	// which reference found nothing).
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed (405): the route exists; the Allow header lists
	// its methods.
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeConflict (409): the queue name is taken, or then names no queue.
	CodeConflict = "conflict"
	// CodeUnfinishedTasks (409): the queue still has unfinished tasks.
	CodeUnfinishedTasks = "unfinished_tasks"
	// CodeTaskState (409): the task's status does not allow the request
	// (a finished task is not killed or cancelled, a running one not
	// cancelled or retried); the message says why. Nothing was written.
	CodeTaskState = "task_state"
	// CodeConflictingFields (409): two fields of the body contradict each
	// other in a way no schema can express (a task's expires_at not after
	// its not_before, a retry_backoff's max below its base); "field" names
	// the second. Nothing was written. A 409 rather than a 400 because the
	// OpenAPI document calls such a body valid, and a 400 says it is not.
	CodeConflictingFields = "conflicting_fields"
	// CodeTooLarge (413): the body, or one task's parameters, is over its
	// limit.
	CodeTooLarge = "too_large"
	// CodeUnsupportedMediaType (415): the body is not application/json.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeInternal (500): the server failed; the message says no more
	// than that, the server's log says what.
	CodeInternal = "internal"
	// CodeMalformedDocument (500): a stored document cannot be read (it
	// was written by another tool or by hand); the message names the field.
	CodeMalformedDocument = "malformed_document"
	// CodeUnavailable (503): GET /api/v1/events while its hub is not
	// running (web/live); any route while the server has not reached
	// MongoDB yet (it listens at once), or while too many password checks
	// run at once (web/auth.ErrBusy; Retry-After says when to try again).
	CodeUnavailable = "unavailable"
)

// apiError is an error response.
type apiError struct {
	status int
	code   string
	msg    string
	field  string // "" writes null
}

func (e *apiError) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

func errorf(status int, code, field, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, field: field, msg: fmt.Sprintf(format, args...)}
}

// errorBody is the one shape of every error response.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Field   *string `json:"field"`
}

// WriteError writes an error response in the v1 shape,
// {"error":{"code":…,"message":…,"field":…}}; an empty field is written as
// null. For code, use one of the Code constants.
func WriteError(w http.ResponseWriter, status int, code, message, field string) {
	d := errorDetail{Code: code, Message: message}
	if field != "" {
		d.Field = &field
	}
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(errorBody{Error: d})
}

// Deny writes a request that authentication refused (web/auth's OnDeny) in
// the v1 error shape: 401 unauthorized, 403 forbidden, else internal.
func Deny(w http.ResponseWriter, _ *http.Request, status int, msg string) {
	code := CodeInternal
	switch status {
	case http.StatusUnauthorized:
		code = CodeUnauthorized
	case http.StatusForbidden:
		code = CodeForbidden
	case http.StatusServiceUnavailable:
		code = CodeUnavailable
	}
	WriteError(w, status, code, msg, "")
}
