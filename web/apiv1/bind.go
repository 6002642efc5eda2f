package apiv1

import (
	"errors"
	"io"
	"math"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/disbatch-go/disbatch/schema"
)

// maxBodyDepth bounds the nesting of a whole request body: a task's
// parameters (maxParamsDepth) and the three levels around them, with room
// to say precisely which limit was passed.
const maxBodyDepth = 128

// readBody reads a JSON request body: Content-Type application/json (a
// charset parameter, if any, must be utf-8), at most maxBytes, one JSON
// value nested at most maxBodyDepth deep.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) (value, *apiError) {
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		return value{}, err
	}
	data, aerr := h.readBytes(w, r)
	if aerr != nil {
		return value{}, aerr
	}
	return parseBody(data)
}

// readOptionalBody is readBody for a route whose body may be left out: an
// empty body (whatever its Content-Type) is none, and ok is false.
func (h *handler) readOptionalBody(w http.ResponseWriter, r *http.Request) (v value, ok bool, aerr *apiError) {
	if r.ContentLength == 0 || r.Body == nil {
		return value{}, false, nil
	}
	data, aerr := h.readBytes(w, r)
	if aerr != nil || len(data) == 0 {
		return value{}, false, aerr
	}
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		return value{}, false, err
	}
	v, aerr = parseBody(data)
	return v, aerr == nil, aerr
}

func (h *handler) readBytes(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > h.maxBody {
		return nil, tooLarge(h.maxBody)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, tooLarge(h.maxBody)
		}
		return nil, errorf(http.StatusBadRequest, CodeInvalidJSON, "", "could not read the request body: %v", err)
	}
	return data, nil
}

func parseBody(data []byte) (value, *apiError) {
	v, perr := parseJSON(data, maxBodyDepth)
	if perr != nil {
		if perr.tooDeep {
			return value{}, errorf(http.StatusBadRequest, CodeTooDeep, deepField(perr.at), "%s", perr.msg)
		}
		return value{}, errorf(http.StatusBadRequest, CodeInvalidJSON, perr.at.String(), "%s", perr.msg)
	}
	return v, nil
}

func tooLarge(n int64) *apiError {
	return errorf(http.StatusRequestEntityTooLarge, CodeTooLarge, "", "the request body is larger than %d bytes", n)
}

// deepField names the field whose value nests too deeply: the task
// parameters it is in, or else the top-level field.
func deepField(at path) string {
	for i, s := range at {
		if !s.isIdx && s.key == "params" {
			return at[:i+1].String()
		}
	}
	if len(at) > 0 && !at[0].isIdx {
		return at[:1].String()
	}
	return ""
}

func checkContentType(ct string) *apiError {
	if ct == "" {
		return errorf(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "", "the request has no Content-Type; send the body as application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return errorf(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "", "Content-Type %q is not supported; send the body as application/json", ct)
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return errorf(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType, "", "Content-Type %q is not supported; JSON is UTF-8 (application/json or application/json; charset=utf-8)", ct)
		}
	}
	return nil
}

// object is a body object being bound to a request.
type object struct {
	at      path
	members []member
}

// asObject accepts v as an object whose keys are all among known.
func asObject(v value, at path, known ...string) (object, *apiError) {
	if v.kind != kindObject {
		if len(at) == 0 {
			return object{}, errorf(http.StatusBadRequest, CodeInvalidField, "", "the body is %s; want a JSON object", v.describe())
		}
		return object{}, invalidField(at, "want an object, got %s", v.describe())
	}
	for _, m := range v.obj {
		ok := false
		for _, k := range known {
			ok = ok || m.key == k
		}
		if !ok {
			return object{}, errorf(http.StatusBadRequest, CodeUnknownField, at.key(m.key).String(),
				"unknown field %q; the fields are %s", m.key, strings.Join(known, ", "))
		}
	}
	return object{at: at, members: v.obj}, nil
}

// get returns the member named key.
func (o object) get(key string) (value, path, bool) {
	for _, m := range o.members {
		if m.key == key {
			return m.val, o.at.key(key), true
		}
	}
	return value{}, o.at.key(key), false
}

// require returns the member named key or a missing_field error.
func (o object) require(key string) (value, path, *apiError) {
	v, at, ok := o.get(key)
	if !ok {
		return value{}, at, errorf(http.StatusBadRequest, CodeMissingField, at.String(), "%s is required", key)
	}
	return v, at, nil
}

func invalidField(at path, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, CodeInvalidField, at.String(), format, args...)
}

func wantString(v value, at path) (string, *apiError) {
	if v.kind != kindString {
		return "", invalidField(at, "want a string, got %s", v.describe())
	}
	return v.s, nil
}

// wantInt accepts a number with an integral value within lo..hi (JSON
// Schema's integer: 3 and 3.0 alike).
func wantInt(v value, at path, lo, hi int64) (int64, *apiError) {
	if v.kind != kindNumber {
		return 0, invalidField(at, "want an integer, got %s", v.describe())
	}
	n, ok := integral(v.s)
	if !ok || n < lo || n > hi {
		return 0, invalidField(at, "want an integer from %d to %d, got %s", lo, hi, v.s)
	}
	return n, nil
}

// integral parses a JSON number literal whose value is an integer that
// fits in an int64.
func integral(lit string) (int64, bool) {
	if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}

// wantMaxThreads accepts null or an integer from 0 to maxThreadsLimit.
func wantMaxThreads(v value, at path) (*int, *apiError) {
	if v.kind == kindNull {
		return nil, nil
	}
	n, err := wantInt(v, at, 0, maxThreadsLimit)
	if err != nil {
		err.msg = "want null or " + strings.TrimPrefix(err.msg, "want ")
		return nil, err
	}
	m := int(n)
	return &m, nil
}

func wantBool(v value, at path) (bool, *apiError) {
	if v.kind != kindBool {
		return false, invalidField(at, "want true or false, got %s", v.describe())
	}
	return v.b, nil
}

// wantNumber accepts a number from lo to hi.
func wantNumber(v value, at path, lo, hi float64) (float64, *apiError) {
	if v.kind != kindNumber {
		return 0, invalidField(at, "want a number, got %s", v.describe())
	}
	f, err := strconv.ParseFloat(v.s, 64)
	if err != nil || f < lo || f > hi {
		return 0, invalidField(at, "want a number from %s to %s, got %s", strconv.FormatFloat(lo, 'f', -1, 64), strconv.FormatFloat(hi, 'f', -1, 64), v.s)
	}
	return f, nil
}

// wantSeconds accepts a number of seconds from 0 to schema.MaxSeconds (a
// year), fractions included.
func wantSeconds(v value, at path) (time.Duration, *apiError) {
	f, err := wantNumber(v, at, 0, schema.MaxSeconds)
	if err != nil {
		err.msg = strings.Replace(err.msg, "want a number", "want a number of seconds", 1)
		return 0, err
	}
	return time.Duration(f * float64(time.Second)), nil
}

// wantTime accepts an RFC 3339 date-time string.
func wantTime(v value, at path) (time.Time, *apiError) {
	s, err := wantString(v, at)
	if err != nil {
		return time.Time{}, err
	}
	t, ok := parseRFC3339(s)
	if !ok {
		return time.Time{}, invalidField(at, "want an RFC 3339 date-time such as 2026-01-02T15:04:05Z, got %q", clip(s))
	}
	return t, nil
}

// dateTime is RFC 3339's date-time (JSON Schema's format date-time), which
// time.Parse reads more loosely (a comma before the fraction, offsets of
// 24 hours or 60 minutes).
var dateTime = regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:([0-9]{2})(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`)

// parseRFC3339 reads an RFC 3339 date-time: a lower-case t or z too, and a
// leap second (23:59:60 in UTC) as the second after 23:59:59.
func parseRFC3339(s string) (time.Time, bool) {
	m := dateTime.FindStringSubmatchIndex(s)
	if m == nil {
		return time.Time{}, false
	}
	u := strings.ToUpper(s)
	leap := u[m[2]:m[3]] == "60"
	if leap {
		u = u[:m[2]] + "59" + u[m[3]:]
	}
	t, err := time.Parse(time.RFC3339Nano, u)
	if err != nil {
		return time.Time{}, false
	}
	if leap {
		if h, m, _ := t.UTC().Clock(); h != 23 || m != 59 {
			return time.Time{}, false
		}
		t = t.Add(time.Second)
	}
	return t, true
}

// wantStrings accepts an array of at most maxItems strings, each checked
// by check.
func wantStrings(v value, at path, maxItems int, check func(string) string) ([]string, *apiError) {
	if v.kind != kindArray {
		return nil, invalidField(at, "want an array of strings, got %s", v.describe())
	}
	if len(v.arr) > maxItems {
		return nil, invalidField(at, "want at most %d items, got %d", maxItems, len(v.arr))
	}
	out := make([]string, 0, len(v.arr))
	for i, e := range v.arr {
		s, err := wantString(e, at.index(i))
		if err != nil {
			return nil, err
		}
		if msg := check(s); msg != "" {
			return nil, invalidField(at.index(i), "%s", msg)
		}
		out = append(out, s)
	}
	return out, nil
}

// Names: what the OpenAPI document's patterns say, checked the same way.

// maxNameLength bounds names, in characters (Unicode code points, as JSON
// Schema's maxLength counts).
const maxNameLength = 256

// maxThreadsLimit is schema.MaxThreadsLimit.
const maxThreadsLimit = math.MaxInt32

// isControl reports the characters no name may hold: C0, DEL and C1.
func isControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// isEdgeSpace reports the white space a name may not start or end with
// (besides the controls): the Unicode white space of JavaScript's \s that
// is not a control character.
func isEdgeSpace(r rune) bool {
	switch r {
	case ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

var hexID = regexp.MustCompile(`^[0-9a-fA-F]{24}$`)

// checkName checks a queue or plugin name: 1 to 256 characters, no
// control characters, no white space at either end. It returns what is
// wrong, or "".
func checkName(s string) string {
	if msg := checkNodeName(s); msg != "" {
		return msg
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if isEdgeSpace(first) || isEdgeSpace(last) {
		return "must not start or end with white space"
	}
	return ""
}

// checkQueueName is checkName, and a queue's name must not look like an
// ObjectId: queues are referred to by name or id.
func checkQueueName(s string) string {
	if msg := checkName(s); msg != "" {
		return msg
	}
	if hexID.MatchString(s) {
		return "must not look like an ObjectId (24 hex digits): queues are referred to by name or id"
	}
	return ""
}

// checkNodeName checks a node name in nodes_pin or nodes_ignore: 1 to 256
// characters, no control characters.
func checkNodeName(s string) string {
	n := utf8.RuneCountInString(s)
	switch {
	case n == 0:
		return "must not be empty"
	case n > maxNameLength:
		return "must be at most " + strconv.Itoa(maxNameLength) + " characters long"
	}
	for _, r := range s {
		if isControl(r) {
			return "must not contain control characters"
		}
	}
	return ""
}
