package apiv1

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A task's parameters are any JSON object, stored as a BSON document in
// the key order given:
//
//   - strings, true, false and null as themselves; arrays and objects
//     nested at most maxParamsDepth levels deep (the parameters object
//     itself is level 1);
//   - a number written without a fraction or exponent as a 32-bit integer
//     when it fits, else a 64-bit one, else (beyond 64 bits) a double, as
//     JavaScript would read it; any other number as a double;
//   - keys must be non-empty and must not start with '$' or contain '.'
//     or NUL: MongoDB reads such keys as operators and paths (the
//     param[...] filter of GET /api/v1/tasks could not reach them), and
//     Disbatch 4.103's Perl nodes sharing the database reject them. '$'
//     is kept free for MongoDB Extended JSON, which a later version may
//     accept.
//
// Parameters are answered as relaxed Extended JSON: plain JSON for all of
// the above, {"$oid": …}, {"$date": …} and so on for BSON types that other
// tools may have written.

const (
	maxParamsDepth = 64
	// maxParamsBytes leaves room in MongoDB's 16 MiB document for the
	// task's other fields.
	maxParamsBytes = 16<<20 - 16<<10
)

var emptyParams = bson.Raw{5, 0, 0, 0, 0}

// paramsToBSON converts a task's parameters.
func paramsToBSON(v value, at path) (bson.Raw, *apiError) {
	if v.kind != kindObject {
		return nil, invalidField(at, "want an object, got %s", v.describe())
	}
	d, err := toBSON(v, at, 1)
	if err != nil {
		return nil, err
	}
	raw, merr := bson.Marshal(d)
	if merr != nil {
		return nil, invalidField(at, "cannot be stored: %v", merr)
	}
	if len(raw) > maxParamsBytes {
		return nil, errorf(http.StatusRequestEntityTooLarge, CodeTooLarge, at.String(), "the parameters take %d bytes as BSON; at most %d fit in a task", len(raw), maxParamsBytes)
	}
	return raw, nil
}

func toBSON(v value, at path, depth int) (any, *apiError) {
	switch v.kind {
	case kindNull:
		return nil, nil
	case kindBool:
		return v.b, nil
	case kindString:
		return v.s, nil
	case kindNumber:
		return numberToBSON(v.s, at)
	}
	if depth > maxParamsDepth {
		return nil, errorf(http.StatusBadRequest, CodeTooDeep, deepField(at), "parameters nest more than %d levels deep", maxParamsDepth)
	}
	if v.kind == kindArray {
		a := make(bson.A, len(v.arr))
		for i, e := range v.arr {
			x, err := toBSON(e, at.index(i), depth+1)
			if err != nil {
				return nil, err
			}
			a[i] = x
		}
		return a, nil
	}
	d := make(bson.D, len(v.obj))
	for i, m := range v.obj {
		if msg := checkParamKey(m.key); msg != "" {
			return nil, invalidField(at.key(m.key), "%s", msg)
		}
		x, err := toBSON(m.val, at.key(m.key), depth+1)
		if err != nil {
			return nil, err
		}
		d[i] = bson.E{Key: m.key, Value: x}
	}
	return d, nil
}

func numberToBSON(lit string, at path) (any, *apiError) {
	if !strings.ContainsAny(lit, ".eE") {
		if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
			if n >= math.MinInt32 && n <= math.MaxInt32 {
				return int32(n), nil
			}
			return n, nil
		}
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) || math.Abs(f) == math.MaxFloat64 && beyondMaxDouble(lit) {
		return nil, invalidField(at, "the number %s is out of range: want a finite double", lit)
	}
	return f, nil
}

// The document bounds numbers in parameters by ±1.7976931348623157e308,
// the largest double as it is written, here as 0.17976931348623157e309.
const (
	maxDoubleDigits = "17976931348623157"
	maxDoublePoint  = 309
)

// beyondMaxDouble reports whether a number literal's magnitude exceeds
// 1.7976931348623157e308 exactly, as JSON Schema's maximum reads it.
// ParseFloat rounds everything from there up to 2^1024 - 2^970 to
// math.MaxFloat64, so the caller asks only then: the literal is then
// near 1.8e308 and its exponent fits an int.
func beyondMaxDouble(lit string) bool {
	mant, exp, _ := strings.Cut(strings.ToLower(strings.TrimPrefix(lit, "-")), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := whole + frac
	point := len(whole) // the value is 0.digits × 10^point
	if exp != "" {
		e, err := strconv.Atoi(exp)
		if err != nil {
			return true
		}
		point += e
	}
	trimmed := strings.TrimLeft(digits, "0")
	point -= len(digits) - len(trimmed)
	digits = strings.TrimRight(trimmed, "0")
	if point != maxDoublePoint {
		return point > maxDoublePoint
	}
	return digits > maxDoubleDigits // same length of whole part: compare as fractions
}

// checkParamKey returns what is wrong with a key of the parameters, or "".
func checkParamKey(k string) string {
	switch {
	case k == "":
		return "keys of parameters must not be empty"
	case k[0] == '$':
		return "keys of parameters must not start with '$'"
	case strings.ContainsRune(k, '.'):
		return "keys of parameters must not contain '.'"
	case strings.ContainsRune(k, 0):
		return "keys of parameters must not contain NUL"
	}
	return ""
}

// paramsJSON renders stored parameters as relaxed Extended JSON.
func paramsJSON(raw bson.Raw) (json.RawMessage, error) {
	if raw == nil {
		raw = emptyParams
	}
	b, err := bson.MarshalExtJSON(raw, false, false)
	if err != nil {
		return nil, err
	}
	// Strings other tools stored may not be UTF-8; JSON must be.
	return bytes.ToValidUTF8(b, []byte("\uFFFD")), nil
}
