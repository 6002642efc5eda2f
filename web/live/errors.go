package live

import (
	"encoding/json"
	"net/http"
)

// Error codes of the v1 error shape this package answers with.
const (
	CodeInvalidParameter = "invalid_parameter" // 400: a query parameter is wrong (Field names it)
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnavailable      = "unavailable" // 503: the hub is not running, or a look-up failed
)

// Error is an error answered before the stream starts, in the v1 API's
// shape: {"error":{"code":…,"message":…,"field":…}} (field null unless one
// parameter is at fault).
type Error struct {
	Status  int
	Code    string
	Message string
	Field   string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func badParam(field, msg string) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidParameter, Field: field, Message: msg}
}

// WriteError writes err in the v1 shape with its status and Content-Type
// application/json: what the hub does when Options.OnError is nil.
func WriteError(w http.ResponseWriter, err *Error) {
	type detail struct {
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Field   *string `json:"field"`
	}
	d := detail{Code: err.Code, Message: err.Message}
	if err.Field != "" {
		d.Field = &err.Field
	}
	body, _ := json.Marshal(struct {
		Error detail `json:"error"`
	}{d})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(err.Status)
	_, _ = w.Write(append(body, '\n'))
}

func (h *Hub) fail(w http.ResponseWriter, r *http.Request, err *Error) {
	if h.opts.OnError != nil {
		h.opts.OnError(w, r, err)
		return
	}
	WriteError(w, err)
}
